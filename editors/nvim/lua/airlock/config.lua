-- Options of require('airlock').setup(); see :help airlock-config.
local M = {}

M.defaults = {
  -- How to start the daemon. It serves the directory it is started in (the root below).
  -- nil: `{ <airlockd found>, 'serve' }`, airlockd looked for as M.places() says.
  cmd = nil,
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

--- Where airlockd is looked for when `cmd` is not configured, first match wins: each folder of
--- PATH (the daemon's: cmd_env's PATH, else Neovim's), the workspace's .venv/bin/airlockd and
--- venv/bin/airlockd, then ~/.local/bin/airlockd (where `make setup` puts its launcher for a
--- normal user). Each place is { path, where }.
function M.places(root)
  local places = {}
  local env = M.values.cmd_env or {}
  for dir in vim.gsplit(env.PATH or vim.env.PATH or '', ':', { plain = true }) do
    -- an empty or relative PATH entry means "wherever Neovim was started": never a guess here
    if dir:sub(1, 1) == '/' then
      table.insert(places, { path = vim.fs.joinpath(dir, 'airlockd'), where = 'on PATH' })
    end
  end
  if root then
    for _, venv in ipairs({ '.venv', 'venv' }) do
      table.insert(places, { path = vim.fs.joinpath(root, venv, 'bin', 'airlockd'), where = "in the workspace's " .. venv })
    end
  end
  local home = env.HOME or vim.env.HOME
  if home and home:sub(1, 1) == '/' then
    table.insert(places, { path = vim.fs.joinpath(home, '.local', 'bin', 'airlockd'), where = 'in ~/.local/bin' })
  end
  return places
end

local function executable(path)
  local st = vim.uv.fs_stat(path)
  return st ~= nil and st.type == 'file' and vim.uv.fs_access(path, 'X') == true
end

--- The command that starts the daemon for `root`: `cmd` as configured, else airlockd found in
--- M.places(root). Returns cmd, how it was chosen ('cmd' or the place's `where`), the path; or
--- nil and the places looked at. `is_executable` is for tests.
function M.command(root, is_executable)
  if M.values.cmd then
    return M.values.cmd, 'cmd', M.values.cmd[1]
  end
  is_executable = is_executable or executable
  local places = M.places(root)
  for _, place in ipairs(places) do
    if is_executable(place.path) then
      return { place.path, 'serve' }, place.where, place.path
    end
  end
  return nil, places
end

--- What to tell the user when no airlockd was found: the places looked at, and the fixes.
function M.not_found(places)
  local looked = {}
  for _, place in ipairs(places) do
    if place.where ~= 'on PATH' then
      table.insert(looked, place.path)
    end
  end
  return 'airlockd not found: looked on PATH, then at ' .. table.concat(looked, ', '),
    {
      'run `make setup` in your airlockd clone: it puts airlockd on your PATH (~/.local/bin, or /usr/local/bin as root)',
      "or set cmd in require('airlock').setup({ cmd = { '/path/to/airlockd', 'serve' } })",
    }
end

function M.set(opts)
  M.values = vim.tbl_deep_extend('force', vim.deepcopy(M.defaults), opts or {})
  if opts and opts.keys == false then
    M.values.keys = false
  end
  return M.values
end

return M
