-- Options of require('airlock').setup(); see :help airlock-config.
local M = {}

M.defaults = {
  -- How to start the daemon. It serves the directory it is started in (the root below).
  cmd = { 'airlockd', 'serve' },
  -- Extra environment for the daemon (e.g. { AIRLOCK_STATE_DIR = '...' }).
  cmd_env = nil,
  -- Files or directories that mark a workspace root, nearest first wins.
  root_markers = { 'policies.toml', '.git' },
  -- Filetypes the client attaches to (nil: every file buffer).
  filetypes = nil,
  -- Buffer-local review keys, present only while the buffer has pending hunks.
  -- Set one to false to leave it unmapped (the <Plug> mapping still exists), or keys = false.
  keys = {
    next_hunk = ']h',
    prev_hunk = '[h',
    accept_hunk = '<leader>ay',
    reject_hunk = '<leader>an',
    accept_file = '<leader>aY',
    reject_file = '<leader>aN',
  },
  -- Show pending hunks on the real buffer (highlight, virtual lines, signs).
  inline = true,
  signs = { add = '+', change = '~', delete = '-', denied = '!' },
  -- Fill the quickfix list with the pending changes when a review starts.
  quickfix = true,
  -- Open the first pending change when a proposal arrives (false: only notify).
  open_on_proposal = false,
  -- Warn (statusline highlight) above this fraction of a limit.
  warn_ratio = 0.8,
}

M.values = vim.deepcopy(M.defaults)

function M.set(opts)
  M.values = vim.tbl_deep_extend('force', vim.deepcopy(M.defaults), opts or {})
  if opts and opts.keys == false then
    M.values.keys = false
  end
  return M.values
end

return M
