-- The agents' own account, live: what a run's agent prints (`airlock/runOutput`: whole lines,
-- redacted and with hidden characters already escaped by the daemon) in one buffer,
-- `airlock://output`, each run under a header line; `:Airlock output` shows it. What the agent
-- says, never evidence: the review shows what the staging filesystem holds.
local esc = require('airlock.escape')

local M = { name = 'airlock://output', max_lines = 5000 }

M.lines = {} -- what the buffer holds (kept when the buffer is closed), the last max_lines
local last_run = nil
local partial = false -- the last line has no end yet (the daemon sends whole lines: only defence)

local function buffer(create)
  local b = vim.fn.bufnr(M.name)
  if b > 0 and vim.api.nvim_buf_is_valid(b) then
    return b
  end
  if not create then
    return nil
  end
  b = vim.api.nvim_create_buf(false, true)
  vim.api.nvim_buf_set_name(b, M.name)
  vim.bo[b].buftype = 'nofile'
  vim.bo[b].bufhidden = 'hide'
  vim.bo[b].swapfile = false
  vim.bo[b].modifiable = false
  return b
end

local function sync()
  local b = buffer(false)
  if not b then
    return
  end
  vim.bo[b].modifiable = true
  vim.api.nvim_buf_set_lines(b, 0, -1, false, M.lines)
  vim.bo[b].modifiable = false
  for _, win in ipairs(vim.fn.win_findbuf(b)) do -- follow the end, as a terminal would
    pcall(vim.api.nvim_win_set_cursor, win, { math.max(1, #M.lines), 0 })
  end
end

--- One `airlock/runOutput` notification.
function M.add(params, agent)
  if params.runId ~= last_run then
    table.insert(M.lines, string.format('── run %s%s ──', esc.display(params.runId), agent and (' (' .. esc.display(agent) .. ')') or ''))
    last_run, partial = params.runId, false
  end
  if type(params.dropped) == 'number' and params.dropped > 0 then
    table.insert(M.lines, string.format('[… %d bytes not shown: the agent printed faster than it is followed]', params.dropped))
    partial = false
  end
  local text = type(params.text) == 'string' and params.text or ''
  local parts = vim.split(text, '\n', { plain = true })
  if parts[#parts] == '' then
    table.remove(parts)
  end
  for i, l in ipairs(parts) do
    l = esc.escape(l)
    if i == 1 and partial and #M.lines > 0 then
      M.lines[#M.lines] = M.lines[#M.lines] .. l
    else
      table.insert(M.lines, l)
    end
  end
  partial = text ~= '' and text:sub(-1) ~= '\n'
  if #M.lines > M.max_lines then
    M.lines = vim.list_slice(M.lines, #M.lines - M.max_lines + 1)
  end
  sync()
end

--- :Airlock output: the buffer in a split below (never taken focus by itself).
function M.show()
  local b = buffer(true)
  sync()
  local win = vim.fn.bufwinid(b)
  if win == -1 then
    vim.cmd('botright split')
    vim.api.nvim_win_set_buf(0, b)
  end
  sync()
  return b
end

function M.reset()
  M.lines, last_run, partial = {}, nil, false
  local b = buffer(false)
  if b then
    pcall(vim.api.nvim_buf_delete, b, { force = true })
  end
end

return M
