-- :checkhealth airlock — the daemon is found (configured, or where it was found: PATH, the
-- workspace's virtualenv, ~/.local/bin) and starts, and `airlockd doctor --json` says the
-- engine is reachable, the runtime image is present and the policy is valid.
local M = {}

local h = vim.health

local function system(cmd, opts)
  local ok, proc = pcall(vim.system, cmd, vim.tbl_extend('force', { text = true }, opts or {}))
  if not ok then
    return nil, tostring(proc)
  end
  local res = proc:wait((opts and opts.timeout) or 60000)
  return res
end

local function frame(msg)
  local body = vim.json.encode(msg)
  return string.format('Content-Length: %d\r\n\r\n%s', #body, body)
end

--- Start `cmd` in `root`, send `initialize`, and wait for its answer (then shut it down).
local function starts(cmd, root, env)
  local out, errs = {}, {}
  local ok, proc = pcall(vim.system, cmd, {
    cwd = root,
    env = env,
    stdin = true,
    stdout = function(_, data)
      if data then
        table.insert(out, data)
      end
    end,
    stderr = function(_, data)
      if data then
        table.insert(errs, data)
      end
    end,
  })
  if not ok then
    return false, tostring(proc)
  end
  proc:write(frame({ jsonrpc = '2.0', id = 1, method = 'initialize', params = { processId = vim.NIL, rootUri = vim.uri_from_fname(root), capabilities = vim.empty_dict() } }))
  local answered = vim.wait(20000, function()
    return table.concat(out):find('"id":%s*1') ~= nil
  end, 50)
  if answered then
    proc:write(frame({ jsonrpc = '2.0', id = 2, method = 'shutdown' }))
    proc:write(frame({ jsonrpc = '2.0', method = 'exit' }))
    proc:write(nil)
  end
  local res = proc:wait(answered and 10000 or 1000)
  if not answered then
    local said = vim.split(vim.trim(table.concat(errs)), '\n')
    local tail = table.concat(vim.list_slice(said, math.max(1, #said - 2)), ' ')
    return false, string.format('no answer to initialize (exit %s): %s', tostring(res.code), tail)
  end
  local text = table.concat(out)
  local name = text:match('"serverInfo":%s*{[^}]-"name":%s*"([^"]+)"') or 'server'
  local version = text:match('"serverInfo":%s*{[^}]-"version":%s*"([^"]+)"') or '?'
  return true, name .. ' ' .. version
end

function M.check()
  local settings = require('airlock.config')
  local config = settings.values
  local lsp = require('airlock.lsp')
  h.start('airlock: the daemon')
  if vim.fn.has('nvim-0.10') == 0 then
    h.error('Neovim 0.10 or newer is needed')
  else
    h.ok('Neovim ' .. tostring(vim.version()))
  end
  local root = lsp.root()
  local cmd, how, exe = settings.command(root)
  if not cmd then
    local msg, fixes = settings.not_found(how)
    h.error(msg, fixes)
    return
  end
  if how == 'cmd' then
    if vim.fn.executable(exe) ~= 1 then
      h.error(exe .. ' (cmd in setup()) not found', { 'correct cmd in require("airlock").setup(), or leave it unset: airlockd is then looked for on PATH, in the workspace\'s .venv and in ~/.local/bin' })
      return
    end
    h.ok('found ' .. vim.fn.exepath(exe) .. ' (cmd in setup())')
  else
    h.ok('found ' .. exe .. ' (' .. how .. ')')
  end
  local client = lsp.client()
  if client then
    h.ok(string.format('running: client %d serves %s', client.id, tostring(client.config.root_dir)))
  else
    local ok, detail = starts(cmd, root, config.cmd_env)
    if ok then
      h.ok('`' .. table.concat(cmd, ' ') .. '` starts and answers initialize: ' .. detail)
    else
      h.error('`' .. table.concat(cmd, ' ') .. '` does not start: ' .. detail, { 'run it in a terminal in ' .. root .. ' to see why' })
    end
  end

  h.start('airlock: airlockd doctor (' .. root .. ')')
  -- The same program with `doctor --json` in place of `serve …`.
  local doctor = {}
  for _, part in ipairs(cmd) do
    if part == 'serve' then
      break
    end
    table.insert(doctor, part)
  end
  vim.list_extend(doctor, { 'doctor', '--json' })
  local res, err = system(doctor, { cwd = root, env = config.cmd_env })
  if not res then
    h.error('airlockd doctor did not run: ' .. tostring(err))
    return
  end
  local okj, report = pcall(vim.json.decode, res.stdout or '')
  if not okj or type(report) ~= 'table' or type(report.checks) ~= 'table' then
    h.error('airlockd doctor --json gave no report (exit ' .. tostring(res.code) .. '): ' .. vim.trim(res.stderr or ''))
    return
  end
  local required = { ['container engine'] = 'engine reachable', ['runtime image'] = 'image present', policy = 'policy valid' }
  for _, c in ipairs(report.checks) do
    local label = required[c.name] and (c.name .. ' (' .. required[c.name] .. ')') or c.name
    if c.ok then
      h.ok(label .. ': ' .. tostring(c.detail))
    elseif required[c.name] then
      h.error(label .. ': ' .. tostring(c.detail), c.fix and c.fix ~= vim.NIL and { c.fix } or nil)
    else
      h.warn(label .. ': ' .. tostring(c.detail), c.fix and c.fix ~= vim.NIL and { c.fix } or nil)
    end
  end
end

return M
