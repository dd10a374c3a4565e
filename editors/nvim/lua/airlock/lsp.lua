-- The language client: registering `airlockd serve`, finding or starting it, and calling its
-- airlock.* commands. Nothing here ever applies a WorkspaceEdit: approvals go through the daemon.
local config = require('airlock.config')
local esc = require('airlock.escape')
local state = require('airlock.state')

local M = { name = 'airlock' }

local NEW = vim.fn.has('nvim-0.11') == 1

-- 0.11 wants client:method(), 0.10 has client.method() closures.
local function request(client, method, params, handler)
  if NEW then
    return client:request(method, params, handler)
  end
  return client.request(method, params, handler)
end

local function stopped(client)
  if NEW then
    return client:is_stopped()
  end
  return client.is_stopped()
end

local function fire()
  vim.schedule(function()
    vim.api.nvim_exec_autocmds('User', { pattern = 'AirlockStatus', modeline = false })
    pcall(vim.cmd.redrawstatus)
  end)
end
M.fire = fire

local function handlers()
  local review = function()
    return require('airlock.review')
  end
  local default_show = vim.lsp.handlers['window/showMessage']
  return {
    ['airlock/runStatus'] = function(_, params)
      state.on_run_status(params)
      if type(params.conflicts) == 'table' and #params.conflicts > 0 then
        local msg = 'airlock: conflicted (edited after the run): ' .. esc.display_all(params.conflicts)
        state.add_log('warn', msg)
      end
      fire()
      M.tick()
    end,
    ['airlock/agentStatus'] = function(_, params)
      state.on_agent(params)
      if params.quarantined then
        state.add_log('error', string.format('agent %s quarantined: %s', params.agent, esc.display(params.reason)))
      end
      fire()
    end,
    ['airlock/runOutput'] = function(_, params)
      local run = state.runs[params.runId]
      vim.schedule(function()
        require('airlock.output').add(params, run and run.agent)
      end)
    end,
    ['airlock/proposal'] = function(_, params)
      local before = state.proposals[params.runId]
      state.on_proposal(params)
      state.add_log('info', string.format('proposal %s: %s', params.runId, params.state))
      vim.schedule(function()
        review().on_proposal(params, before)
      end)
      fire()
    end,
    ['window/showMessage'] = function(err, result, ctx, cfg)
      if result and result.message then
        local lvl = ({ 'error', 'warn', 'info', 'info' })[result.type] or 'info'
        result = vim.tbl_extend('force', result, { message = esc.escape(result.message) })
        state.add_log(lvl, result.message)
      end
      return default_show(err, result, ctx, cfg)
    end,
    -- The daemon never asks for this; if anything ever does, refuse: review is airlock.approve.
    ['workspace/applyEdit'] = function()
      state.add_log('warn', 'refused a workspace/applyEdit request: changes land only through airlock.approve')
      return { applied = false, failureReason = 'airlock.nvim never applies edits; use :Airlock accept' }
    end,
  }
end

--- A buffer that is a file on disk (not a scratch, help, health:// or other scheme buffer).
local function is_file_buffer(bufnr)
  if vim.bo[bufnr].buftype ~= '' then
    return false
  end
  local name = vim.api.nvim_buf_get_name(bufnr)
  return name ~= '' and not name:match('^%a[%w+.-]*://')
end
M.is_file_buffer = is_file_buffer

local function root_of(bufnr)
  local markers = config.values.root_markers
  local root = vim.fs.root(bufnr or 0, markers)
  if not root then
    root = vim.fs.root(vim.fn.getcwd(), markers)
  end
  return root or vim.fn.getcwd()
end
M.root_of = root_of

-- Said once per root: the FileType autocommand asks again for every buffer.
local told = {}

--- The daemon's command for `root` (configured, or airlockd found); nil, after telling the user
--- where it was looked for, when there is none.
local function command_for(root)
  local cmd, how = config.command(root)
  if cmd then
    return cmd
  end
  local msg, fixes = config.not_found(how)
  local key = root or ''
  if not told[key] then
    told[key] = true
    state.add_log('error', msg)
    vim.schedule(function()
      vim.notify('airlock: ' .. msg .. '\n' .. table.concat(fixes, '\n') .. '\n(:checkhealth airlock)', vim.log.levels.ERROR)
    end)
  end
  return nil
end
M.command_for = command_for

local function start_rpc(dispatchers, cfg)
  local root = cfg and cfg.root_dir or nil
  local cmd = command_for(root) or { 'airlockd', 'serve' } -- root_dir() only offers roots it found one for
  return vim.lsp.rpc.start(cmd, dispatchers, { cwd = root, env = config.values.cmd_env })
end

--- The client configuration (both 0.10's vim.lsp.start and 0.11's vim.lsp.config take it);
--- nil when no airlockd is configured or found for `root`.
function M.client_config(root)
  local c = config.values
  local cmd
  if root then -- nil: 0.11's registration, which resolves the command per root (start_rpc)
    cmd = command_for(root)
    if not cmd then
      return nil
    end
  end
  local cfg = {
    name = M.name,
    cmd = cmd,
    cmd_env = c.cmd_env,
    cmd_cwd = root,
    root_dir = root,
    filetypes = c.filetypes,
    root_markers = c.root_markers,
    handlers = handlers(),
    on_init = function(client)
      M.on_init(client)
    end,
    on_exit = function()
      fire()
    end,
  }
  if NEW then
    -- The daemon serves its working directory: start it in the resolved root.
    cfg.cmd = start_rpc
    cfg.cmd_cwd = nil
  end
  return cfg
end

function M.on_init(client)
  request(client, 'workspace/executeCommand', { command = 'airlock.listAgents', arguments = { vim.empty_dict() } }, function(err, res)
    if not err then
      state.set_agents(res)
      fire()
    end
  end)
end

--- Register the server. On 0.11: vim.lsp.config + vim.lsp.enable; on 0.10: a FileType autocmd.
function M.register()
  local group = vim.api.nvim_create_augroup('airlock.lsp', { clear = true })
  if vim.lsp.config and vim.lsp.enable then
    local cfg = M.client_config(nil)
    cfg.root_dir = function(bufnr, on_dir)
      if is_file_buffer(bufnr) then
        local root = root_of(bufnr)
        if command_for(root) then
          on_dir(root)
        end
      end
    end
    vim.lsp.config(M.name, cfg)
    vim.lsp.enable(M.name)
  else
    vim.api.nvim_create_autocmd('FileType', {
      group = group,
      callback = function(ev)
        if is_file_buffer(ev.buf) then
          local ft = config.values.filetypes
          local cfg = M.client_config(root_of(ev.buf))
          if cfg and (not ft or vim.tbl_contains(ft, vim.bo[ev.buf].filetype)) then
            vim.lsp.start(cfg, { bufnr = ev.buf })
          end
        end
      end,
    })
  end
  -- Files without a filetype never fire FileType: attach them too, so the daemon sees every
  -- open buffer (it refuses to commit over unsaved changes it knows of).
  vim.api.nvim_create_autocmd({ 'BufReadPost', 'BufNewFile' }, {
    group = group,
    callback = function(ev)
      vim.schedule(function()
        if not vim.api.nvim_buf_is_valid(ev.buf) or not is_file_buffer(ev.buf) then
          return
        end
        local client = M.client()
        if client and not vim.lsp.buf_is_attached(ev.buf, client.id) then
          local name = vim.api.nvim_buf_get_name(ev.buf)
          local root = client.config.root_dir
          if root and vim.startswith(vim.fs.normalize(name), vim.fs.normalize(root) .. '/') then
            vim.lsp.buf_attach_client(ev.buf, client.id)
          end
        end
      end)
    end,
  })
  -- Progress of runs ($/progress from the daemon), into the statusline.
  vim.api.nvim_create_autocmd('LspProgress', {
    group = group,
    callback = function(ev)
      local client = vim.lsp.get_client_by_id(ev.data.client_id)
      if not client or client.name ~= M.name then
        return
      end
      local p = ev.data.params
      local token = tostring(p.token or '')
      local run_id = token:match('^airlock%-run%-(.+)$')
      local v = p.value or {}
      if run_id then
        state.on_progress(run_id, v.message or v.title)
        if v.kind == 'end' then
          state.add_log('info', string.format('run %s: %s', run_id, tostring(v.message)))
        end
        fire()
      end
    end,
  })
end

--- The running airlock client, if any.
function M.client()
  local clients = vim.lsp.get_clients({ name = M.name })
  local live
  for _, c in ipairs(clients) do
    if not stopped(c) then
      live = live or c
    end
  end
  return live
end

--- The client, started now if needed (commands work from any buffer).
function M.ensure()
  local client = M.client()
  if client then
    return client
  end
  local bufnr = vim.api.nvim_get_current_buf()
  local root = root_of(bufnr)
  local cfg = M.client_config(root)
  if not cfg then
    return nil
  end
  local id
  if NEW then
    id = vim.lsp.start(cfg, { bufnr = bufnr, attach = is_file_buffer(bufnr) })
  elseif is_file_buffer(bufnr) then
    id = vim.lsp.start(cfg, { bufnr = bufnr })
  else
    id = vim.lsp.start_client(cfg)
  end
  return id and vim.lsp.get_client_by_id(id)
end

--- The workspace root the daemon serves.
function M.root()
  local c = M.client()
  local root = c and c.config.root_dir or root_of(0)
  return vim.uv.fs_realpath(root) or root
end

local function error_text(err)
  local msg = esc.escape(err.message or tostring(err))
  local data = err.data
  if type(data) == 'table' and type(data.paths) == 'table' and #data.paths > 0 then
    msg = msg .. ' [' .. esc.display_all(data.paths) .. ']'
  end
  return msg
end
M.error_text = error_text

--- Call airlock.<name> with one argument object; cb(err, result) on the main loop.
--- Errors are reported (vim.notify) unless opts.quiet.
function M.command(name, args, cb, opts)
  opts = opts or {}
  local client = M.ensure()
  if not client then
    local e = { message = 'airlock: the daemon is not running (see :checkhealth airlock)' }
    vim.notify(e.message, vim.log.levels.ERROR)
    if cb then
      cb(e, nil)
    end
    return
  end
  if args == nil or next(args) == nil then
    args = vim.empty_dict() -- {} would be sent as [], and the daemon wants one object
  end
  local params = { command = 'airlock.' .. name, arguments = { args } }
  request(client, 'workspace/executeCommand', params, function(err, result)
    if err then
      local text = 'airlock.' .. name .. ': ' .. error_text(err)
      state.add_log('error', text)
      if not opts.quiet then
        vim.notify(text, vim.log.levels.ERROR)
      end
    end
    if cb then
      cb(err, result)
    end
  end)
end

--- Synchronous variant for scripts and tests: returns err, result.
function M.command_sync(name, args, timeout)
  local done, e, r = false, nil, nil
  M.command(name, args, function(err, res)
    done, e, r = true, err, res
  end, { quiet = true })
  vim.wait(timeout or 30000, function()
    return done
  end, 20)
  if not done then
    return { message = 'timed out' }, nil
  end
  return e, r
end

-- While a run is live, redraw the statusline every second (elapsed time moves on).
local timer
function M.tick()
  if timer or not state.live_run() then
    return
  end
  timer = vim.uv.new_timer()
  timer:start(1000, 1000, vim.schedule_wrap(function()
    if not state.live_run() then
      if timer then
        timer:stop()
        timer:close()
        timer = nil
      end
    end
    fire()
  end))
end

return M
