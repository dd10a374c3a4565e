-- Unit tests of the plugin's logic that need no daemon (statusline, hunk lookup, proposed text,
-- completion, keys appearing and going), run by runner.lua.
vim.opt.rtp:prepend(vim.env.AIRLOCK_PLUGIN)
vim.cmd('runtime plugin/airlock.lua')

local t = dofile(vim.fs.dirname(debug.getinfo(1, 'S').source:sub(2)) .. '/runner.lua')
local it, eq = t.it, t.eq

local airlock = require('airlock').setup({ cmd = { 'false' } })
local state = airlock.state
local review = require('airlock.review')
local commands = require('airlock.commands')

local function proposal()
  return {
    runId = 'r1',
    agent = 'bot',
    state = 'proposed',
    files = {
      {
        path = 'src/a.py',
        change = 'modified',
        state = 'pending',
        decision = 'review',
        rule = 'r',
        hunks = {
          { id = 'h1', state = 'accepted', range = { start = { line = 0 } }, oldLines = 1, newLines = 2, oldText = 'a\n', newText = 'A\nA2\n' },
          { id = 'h2', state = 'pending', range = { start = { line = 4 } }, oldLines = 2, newLines = 1, oldText = 'e\nf\n', newText = 'EF\n' },
          { id = 'h3', state = 'pending', range = { start = { line = 9 } }, oldLines = 0, newLines = 1, oldText = '', newText = 'tail\n' },
        },
      },
      { path = 'src/new.py', change = 'created', state = 'pending', decision = 'auto', rule = 'r', hunks = vim.NIL },
      { path = 'src/done.py', change = 'modified', state = 'accepted', decision = 'auto', rule = 'r', hunks = {} },
    },
    denied = { { path = 'AGENTS.md', change = 'modified', rule = 'invariant:protected', reason = 'no' } },
  }
end

it('statusline: idle, running with limits, warn above 80% of memory, reviewing, ended', function()
  state.reset()
  eq('airlock: idle', airlock.statusline({ plain = true }))
  state.set_agents({ { agent = 'bot', quarantined = false, limits = { memory_mb = 100, cpus = 1, wall_time_s = 600 } } })
  state.on_run_status({ runId = 'r1', agent = 'bot', state = 'running', elapsedS = 75, cpuPct = 12.4, memBytes = 50 * 1048576, tokens = 321 })
  eq('airlock: bot running 1m15s · cpu 12% · mem 50/100M · 321 tok', airlock.statusline({ plain = true }))
  eq('airlock: bot running 1m15s · cpu 12%% · mem 50/100M · 321 tok', airlock.statusline(), 'escaped %')
  state.on_run_status({ runId = 'r1', agent = 'bot', state = 'running', elapsedS = 75, cpuPct = 12, memBytes = 90 * 1048576, tokens = 0 })
  eq('warn', airlock.status().level)
  assert(airlock.statusline():find('^%%#AirlockStatusWarn#'), airlock.statusline())
  state.on_proposal(proposal())
  eq('airlock: reviewing 3 hunks in 2 files', airlock.statusline({ plain = true }))
  local p = proposal()
  p.state = 'applied'
  state.on_proposal(p)
  eq('airlock: bot applied', airlock.statusline({ plain = true }))
end)

it('statusline: quarantine is an error', function()
  state.reset()
  state.on_agent({ agent = 'bot', quarantined = true, reason = '3 violations' })
  eq('airlock: idle | bot QUARANTINED: 3 violations', airlock.statusline({ plain = true }))
  eq('%#AirlockStatusError#airlock: idle | bot QUARANTINED: 3 violations%*', airlock.statusline())
  state.on_agent({ agent = 'bot', quarantined = false, reason = vim.NIL })
  eq('airlock: idle', airlock.statusline({ plain = true }))
end)

it('hunk at the cursor, pending hunks only; insertion hunks at their line or the one above', function()
  local f = proposal().files[1]
  eq(nil, review.hunk_at(f, 0), 'accepted hunk is not offered')
  eq('h2', review.hunk_at(f, 4).id)
  eq('h2', review.hunk_at(f, 5).id)
  eq(nil, review.hunk_at(f, 6))
  eq('h3', review.hunk_at(f, 9).id)
  eq('h3', review.hunk_at(f, 8).id)
end)

it('proposed text, quickfix entries, keys and marks on a real buffer that is never modified', function()
  state.reset()
  local dir = vim.fn.tempname()
  vim.fn.mkdir(dir .. '/src', 'p')
  vim.fn.writefile({}, dir .. '/policies.toml')
  local text = { 'A', 'A2', 'b', 'c', 'e', 'f', 'g', 'h', 'i' }
  vim.fn.writefile(text, dir .. '/src/a.py')
  vim.cmd.cd(dir)
  vim.cmd.edit('src/a.py')
  local buf = vim.api.nvim_get_current_buf()
  eq('src/a.py', review.path_of(buf))
  state.on_proposal(proposal())
  review.on_proposal(proposal(), nil)
  eq(text, vim.api.nvim_buf_get_lines(buf, 0, -1, false), 'buffer untouched')
  eq(false, vim.bo[buf].modified)
  eq({ 'A', 'A2', 'b', 'c', 'EF', 'g', 'h', 'i', 'tail' }, review.proposed_lines(buf, state.proposals.r1.files[1]))
  local marks = vim.api.nvim_buf_get_extmarks(buf, review.ns, 0, -1, { details = true })
  assert(#marks >= 3, 'marks: ' .. #marks)
  eq(1, vim.fn.maparg(']h', 'n', false, true).buffer, ']h is buffer-local')
  eq(1, vim.fn.maparg('<Plug>(airlock-accept-hunk)', 'n', false, true).buffer)
  vim.api.nvim_win_set_cursor(0, { 1, 0 })
  vim.api.nvim_feedkeys(vim.keycode(']h'), 'mx', false)
  eq(5, vim.api.nvim_win_get_cursor(0)[1], ']h')
  vim.api.nvim_feedkeys(vim.keycode(']h'), 'mx', false)
  eq(9, vim.api.nvim_win_get_cursor(0)[1], ']h at the end')
  vim.api.nvim_feedkeys(vim.keycode('[h'), 'mx', false)
  eq(5, vim.api.nvim_win_get_cursor(0)[1], '[h')
  local items = review.quickfix_items(state.proposals.r1)
  eq(4, #items)
  eq('E', items[4].type)
  -- the file is decided: marks and keys go
  local p = proposal()
  p.files[1].state = 'accepted'
  state.on_proposal(p)
  review.on_proposal(p, proposal())
  eq(0, #vim.api.nvim_buf_get_extmarks(buf, review.ns, 0, -1, {}))
  eq(vim.empty_dict(), vim.fn.maparg(']h', 'n', false, true))
  eq(vim.empty_dict(), vim.fn.maparg('<Plug>(airlock-accept-hunk)', 'n', false, true))
end)

it('a user mapping on the same key is left alone', function()
  state.reset()
  local buf = vim.api.nvim_get_current_buf()
  vim.keymap.set('n', ']h', '<Nop>', { buffer = buf, desc = 'mine' })
  state.on_proposal(proposal())
  review.render(buf)
  eq('mine', vim.fn.maparg(']h', 'n', false, true).desc)
  local p = proposal()
  p.state = 'rejected'
  state.on_proposal(p)
  review.render(buf)
  eq('mine', vim.fn.maparg(']h', 'n', false, true).desc)
end)

it('denied changes are refused before asking the daemon', function()
  state.reset()
  state.on_proposal(proposal())
  local got
  review.decide('accept', 'file', 'AGENTS.md', function(err)
    got = err
  end)
  assert(got and got.message:find('denied by invariant:protected'), vim.inspect(got))
end)

it('completion', function()
  state.reset()
  state.on_agent({ agent = 'bot' })
  state.on_proposal(proposal())
  eq({ 'accept' }, vim.fn.getcompletion('Airlock acc', 'cmdline'))
  eq({ 'hunk', 'file', 'all' }, vim.fn.getcompletion('Airlock reject ', 'cmdline'))
  eq({ 'src/a.py', 'src/new.py' }, vim.fn.getcompletion('Airlock accept file ', 'cmdline'))
  eq({ 'bot' }, vim.fn.getcompletion('Airlock run ', 'cmdline'))
  eq(commands.ORDER, vim.fn.getcompletion('Airlock ', 'cmdline'))
end)

it('the evidence printer', function()
  eq({ 'a: 1', 'b:', '  - x', 'c:', '  d: null' }, commands.pretty({ a = 1, b = { 'x' }, c = { d = vim.NIL } }))
end)

it('the help file has tags and :helptags takes it', function()
  local dir = vim.fn.tempname()
  vim.fn.mkdir(dir, 'p')
  vim.fn.writefile(vim.fn.readfile(vim.env.AIRLOCK_PLUGIN .. '/doc/airlock.txt'), dir .. '/airlock.txt')
  vim.cmd.helptags(vim.fn.fnameescape(dir))
  local tags = table.concat(vim.fn.readfile(dir .. '/tags'), '\n')
  for _, tag in ipairs({ 'airlock.setup()', ':Airlock', ':Airlock-accept', 'airlock-keys', 'airlock.statusline()', 'airlock-health' }) do
    assert(tags:find(vim.pesc(tag) .. '\t'), 'missing tag ' .. tag)
  end
end)

it('airlockd found without cmd: PATH, the workspace .venv, venv, ~/.local/bin, in that order', function()
  local config = require('airlock.config')
  local saved, saved_path, saved_home = config.values.cmd, vim.env.PATH, vim.env.HOME
  config.values.cmd = nil
  vim.env.PATH, vim.env.HOME = '/usr/local/bin::rel:/usr/bin', '/home/ann'
  local ok, err = pcall(function()
    local all = { '/usr/bin/airlockd', '/ws/.venv/bin/airlockd', '/ws/venv/bin/airlockd', '/home/ann/.local/bin/airlockd' }
    local where = { 'on PATH', "in the workspace's .venv", "in the workspace's venv", 'in ~/.local/bin' }
    for i = 1, #all do
      local asked = {}
      local cmd, how, path = config.command('/ws', function(p)
        table.insert(asked, p)
        return vim.tbl_contains(vim.list_slice(all, i), p)
      end)
      eq({ all[i], 'serve' }, cmd, 'cmd')
      eq(where[i], how, 'where')
      eq(all[i], path, 'path')
      eq('/usr/local/bin/airlockd', asked[1], 'first place asked') -- empty and relative entries skipped
    end
    local cmd, places = config.command('/ws', function()
      return false
    end)
    eq(nil, cmd)
    local msg, fixes = config.not_found(places)
    eq('airlockd not found: looked on PATH, then at /ws/.venv/bin/airlockd, /ws/venv/bin/airlockd, /home/ann/.local/bin/airlockd', msg)
    assert(fixes[1]:find('make setup', 1, true) and fixes[2]:find('cmd', 1, true), vim.inspect(fixes))
    -- the daemon's own PATH (cmd_env) is the one searched; a configured cmd is used as it is
    config.values.cmd_env = { PATH = '/opt/air/bin' }
    eq({ '/opt/air/bin/airlockd', 'serve' }, (config.command('/ws', function(p)
      return p == '/opt/air/bin/airlockd' or p == '/usr/bin/airlockd'
    end)))
    config.values.cmd_env = nil
    config.values.cmd = { '/x/airlockd', 'serve' }
    eq({ { '/x/airlockd', 'serve' }, 'cmd', '/x/airlockd' }, { config.command('/ws', function()
      error('a configured cmd is not searched for')
    end) })
  end)
  config.values.cmd, config.values.cmd_env, vim.env.PATH, vim.env.HOME = saved, nil, saved_path, saved_home
  assert(ok, err)
end)

it("the agent's output: runs under their headers, lines whole, escapes shown, what was dropped said", function()
  local output = require('airlock.output')
  output.reset()
  output.add({ runId = 'r7', text = 'reading src/\\x1b[2J\nhalf ' }, 'claude')
  output.add({ runId = 'r7', text = 'done\n', dropped = 2048 })
  output.add({ runId = 'r8', text = 'other\tline\n\x1b[31mraw\n' })
  eq({
    '── run r7 (claude) ──',
    'reading src/\\x1b[2J',
    'half ',
    '[… 2048 bytes not shown: the agent printed faster than it is followed]',
    'done',
    '── run r8 ──',
    'other\tline',
    '\\x1b[31mraw', -- one the daemon would have escaped is escaped here too
  }, output.lines)
  local b = output.show()
  eq(output.name, vim.api.nvim_buf_get_name(b))
  eq(output.lines, vim.api.nvim_buf_get_lines(b, 0, -1, false))
  eq(false, vim.bo[b].modifiable)
  output.add({ runId = 'r8', text = 'more\n' })
  eq('more', vim.api.nvim_buf_get_lines(b, -2, -1, false)[1]) -- the shown buffer follows
  vim.cmd('close')
  output.reset()
end)

t.finish()
