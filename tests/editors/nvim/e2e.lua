-- End to end in a real, headless Neovim against the real daemon and engine (driven by
-- tests/editors/test_nvim.py). Each step's observations go into a JSON file the pytest side checks;
-- a failed expectation here stops the script and is reported there with its step.
--
-- Environment: AIRLOCK_PLUGIN (editors/nvim), AIRLOCK_CMD (JSON list), AIRLOCK_WS (workspace),
-- AIRLOCK_OUT (result file), AIRLOCK_SCRIPT (the agent's shell script), AIRLOCK_TIMEOUT_MS.
local env = vim.env
vim.opt.rtp:prepend(env.AIRLOCK_PLUGIN)
vim.cmd('runtime plugin/airlock.lua')
vim.cmd.cd(env.AIRLOCK_WS)

local out = { steps = {}, statuslines = {}, messages = {} }
local TIMEOUT = tonumber(env.AIRLOCK_TIMEOUT_MS or '120000')

local function save()
  local f = assert(io.open(env.AIRLOCK_OUT, 'w'))
  f:write(vim.json.encode(out))
  f:close()
end

local function expect(cond, what, ...)
  if not cond then
    error(string.format(what, ...), 2)
  end
end

local function wait(what, pred, ms)
  local ok = vim.wait(ms or TIMEOUT, pred, 50)
  expect(ok, 'timed out waiting for %s', what)
end

local function lines(bufnr)
  return table.concat(vim.api.nvim_buf_get_lines(bufnr, 0, -1, false), '\n') .. '\n'
end

local function step(name, fn)
  local t0 = vim.uv.hrtime()
  local ok, err = xpcall(fn, debug.traceback)
  table.insert(out.steps, { name = name, ok = ok, error = not ok and err or nil, ms = (vim.uv.hrtime() - t0) / 1e6 })
  save()
  if not ok then
    io.stderr:write('step ' .. name .. ' failed: ' .. err .. '\n')
    vim.cmd('qa!')
  end
end

local airlock = require('airlock')
local review = require('airlock.review')
local state = airlock.state

-- notifications the person would see
local notify = vim.notify
vim.notify = function(msg, level, o)
  table.insert(out.messages, { msg = msg, level = level })
  return notify(msg, level, o)
end

vim.api.nvim_create_autocmd('User', {
  pattern = 'AirlockStatus',
  callback = function()
    local s = airlock.statusline({ plain = true })
    if out.statuslines[#out.statuslines] ~= s then
      table.insert(out.statuslines, s)
    end
  end,
})
local progress = {}
vim.api.nvim_create_autocmd('LspProgress', {
  callback = function(ev)
    local v = ev.data.params.value
    table.insert(progress, v.kind .. ':' .. tostring(v.message))
  end,
})

local mod_buf, run_id

local function proposal()
  return run_id and state.proposals[run_id]
end

-- wait for run `id` to be proposed; a run that ended otherwise fails at once, with the daemon's word
local BAD = { failed = true, stopped = true, killed = true, limit_exceeded = true, rejected_at_admission = true }
local function proposed(id)
  wait('run ' .. id .. ' to be proposed', function()
    local r = state.runs[id]
    if r and BAD[r.state] then
      local said = {}
      for _, m in ipairs(out.messages) do
        table.insert(said, m.msg)
      end
      for _, e in ipairs(state.log) do
        table.insert(said, e.text)
      end
      error(string.format('run %s %s: %s', id, r.state, table.concat(said, ' / ')))
    end
    local p = state.proposals[id]
    return p and p.state == 'proposed'
  end)
end

local function file(path)
  for _, f in ipairs(proposal().files) do
    if f.path == path then
      return f
    end
  end
end

local function marks(bufnr)
  return vim.api.nvim_buf_get_extmarks(bufnr, review.ns, 0, -1, { details = true })
end

local function buf_map(lhs)
  local m = vim.fn.maparg(lhs, 'n', false, true)
  return m.buffer == 1
end

step('setup and attach', function()
  airlock.setup({ cmd = vim.json.decode(env.AIRLOCK_CMD) })
  vim.cmd.edit('src/mod.py')
  mod_buf = vim.api.nvim_get_current_buf()
  wait('the client to initialize', function()
    local c = airlock.client()
    return c and c.initialized and vim.lsp.buf_is_attached(mod_buf, c.id)
  end, 30000)
  wait('listAgents', function()
    return state.agents.bot ~= nil
  end, 10000)
  out.idle_statusline = airlock.statusline({ plain = true })
  out.mod_before = lines(mod_buf)
end)

step(':Airlock run with the agent picker and the prompt input', function()
  local offered
  vim.ui.select = function(items, opts, on_choice)
    offered = vim.tbl_map(function(a)
      return opts.format_item(a)
    end, items)
    for _, a in ipairs(items) do
      if a.agent == 'bot' then
        return on_choice(a)
      end
    end
  end
  vim.ui.input = function(_, on_confirm)
    on_confirm(env.AIRLOCK_SCRIPT)
  end
  vim.cmd('Airlock run')
  wait('the run to start', function()
    return state.last_run ~= nil
  end, 30000)
  run_id = state.last_run
  out.run_id = run_id
  out.agents_offered = offered
  proposed(run_id)
  -- the work-done progress ends once the run's thread is done, shortly after the proposal
  wait('the progress to end', function()
    return vim.tbl_contains(vim.tbl_map(function(p)
      return p:match('^end:') ~= nil
    end, progress), true)
  end, 30000)
  out.progress = progress
  out.proposed_statusline = airlock.statusline({ plain = true })
  out.proposed_statusline_markup = airlock.statusline()
end)

step('review shows hunks on the unmodified buffer, keys present', function()
  local done
  vim.cmd('Airlock review')
  wait('review', function()
    return #vim.fn.getqflist() > 0
  end, 10000)
  done = true
  vim.cmd.buffer(mod_buf)
  out.qf = vim.tbl_map(function(it)
    return { path = review.path_of(it.bufnr), lnum = it.lnum, type = it.type, text = it.text }
  end, vim.fn.getqflist())
  out.mod_during_review = lines(mod_buf)
  out.mod_modified = vim.bo[mod_buf].modified
  local ms = marks(mod_buf)
  local virt, hl = {}, 0
  for _, m in ipairs(ms) do
    local d = m[4]
    if d.virt_lines then
      for _, vl in ipairs(d.virt_lines) do
        table.insert(virt, vl[1][1])
      end
    end
    if d.line_hl_group then
      hl = hl + 1
    end
  end
  out.virt_lines = virt
  out.highlighted_old_lines = hl
  out.keys_during_review = {}
  for _, lhs in ipairs({ ']h', '[h', '<Leader>ay', '<Leader>an', '<Leader>aY', '<Leader>aN', '<Plug>(airlock-accept-hunk)' }) do
    out.keys_during_review[lhs] = buf_map(lhs)
  end
  out.completion = vim.fn.getcompletion('Airlock accept file ', 'cmdline')
  out.completion_sub = vim.fn.getcompletion('Airlock ', 'cmdline')
  expect(done, 'review')
end)

step(':Airlock diff opens the proposed text in diff mode', function()
  vim.cmd.buffer(mod_buf)
  local sb = review.diff()
  expect(sb, 'no scratch buffer')
  out.diff_buffer = lines(sb)
  out.diff_name = vim.api.nvim_buf_get_name(sb)
  out.diff_mode = vim.wo[vim.fn.bufwinid(sb)].diff and vim.wo[vim.fn.bufwinid(mod_buf)].diff
  vim.cmd('bwipeout ' .. sb)
  vim.cmd('only')
  vim.cmd.buffer(mod_buf)
end)

local function decided(n_before)
  wait('the decision to land', function()
    local h, _ = state.pending_counts(proposal())
    return h < n_before
  end, 30000)
end

step('accept the first hunk with ]h and <leader>ay', function()
  vim.api.nvim_win_set_cursor(0, { 1, 0 })
  vim.api.nvim_feedkeys(vim.keycode(']h'), 'mx', false)
  out.cursor_first_hunk = vim.api.nvim_win_get_cursor(0)[1]
  local before = state.pending_counts(proposal())
  vim.api.nvim_feedkeys(vim.keycode('<Leader>ay'), 'mx', false)
  decided(before)
  wait('mod.py to reload', function()
    return lines(mod_buf) ~= out.mod_before
  end, 10000)
  out.mod_after_accept = lines(mod_buf)
  out.statusline_after_accept = airlock.statusline({ plain = true })
end)

step('reject the second hunk of the same file with ]h and <leader>an', function()
  vim.api.nvim_feedkeys(vim.keycode(']h'), 'mx', false)
  out.cursor_second_hunk = vim.api.nvim_win_get_cursor(0)[1]
  local before = state.pending_counts(proposal())
  vim.api.nvim_feedkeys(vim.keycode('<Leader>an'), 'mx', false)
  decided(before)
  out.mod_file_state = file('src/mod.py').state
  out.mod_hunk_states = vim.tbl_map(function(h)
    return h.state
  end, file('src/mod.py').hunks)
  out.keys_after_file_done = buf_map(']h') or buf_map('<Leader>ay')
  out.marks_after_file_done = #marks(mod_buf)
end)

step('a denied change is never offered', function()
  local got
  airlock.decide('accept', 'file', 'AGENTS.md', function(err)
    got = err
  end)
  wait('refusal', function()
    return got ~= nil
  end, 5000)
  out.denied_refusal = got.message
end)

step(':Airlock accept file for the created file', function()
  local before = state.pending_counts(proposal())
  vim.cmd('Airlock accept file src/new.py')
  decided(before)
  wait('the run to settle', function()
    return proposal().state ~= 'proposed'
  end, 30000)
  out.run_state = proposal().state
  out.new_file_state = file('src/new.py').state
end)

step('after the review', function()
  vim.cmd.buffer(mod_buf)
  out.mod_final = lines(mod_buf)
  out.mod_on_disk = table.concat(vim.fn.readfile('src/mod.py'), '\n') .. '\n'
  out.new_file_on_disk = table.concat(vim.fn.readfile('src/new.py'), '\n') .. '\n'
  out.mod_final_modified = vim.bo[mod_buf].modified
  out.marks_final = #marks(mod_buf)
  out.final_statusline = airlock.statusline({ plain = true })
  out.keys_final = buf_map(']h')
  vim.cmd('Airlock log')
  out.log = lines(vim.api.nvim_get_current_buf())
end)

step(':Airlock evidence shows the rules hit', function()
  vim.cmd('Airlock evidence ' .. run_id)
  wait('the evidence buffer', function()
    return vim.api.nvim_buf_get_name(0):find('airlock://evidence/', 1, true) ~= nil
  end, 10000)
  out.evidence = lines(vim.api.nvim_get_current_buf())
  vim.cmd('only')
  vim.cmd.buffer(mod_buf)
end)

step(':Airlock followup, then :Airlock reject all', function()
  vim.ui.input = function(_, on_confirm)
    on_confirm("echo 'X = 3' >> src/new.py")
  end
  vim.cmd('Airlock followup')
  wait('the follow-up to start', function()
    return state.last_run ~= run_id
  end, 30000)
  local second = state.last_run
  out.followup_agent = state.runs[second].agent
  proposed(second)
  out.followup_statusline = airlock.statusline({ plain = true })
  -- an unsaved edit in the buffer of that file: accepting must write nothing and keep the edit
  vim.cmd.edit('src/new.py')
  local nb = vim.api.nvim_get_current_buf()
  wait('new.py to attach', function()
    return vim.lsp.buf_is_attached(nb, airlock.client().id)
  end, 10000)
  vim.api.nvim_buf_set_lines(nb, 0, 0, false, { '# mine, unsaved' })
  local got
  airlock.decide('accept', 'file', 'src/new.py', function(err)
    got = err or false
  end)
  wait('the approval answer', function()
    return got ~= nil
  end, 30000)
  out.dirty_error = got and { code = got.code, message = got.message } or nil
  out.dirty_buffer = lines(nb)
  out.dirty_disk = table.concat(vim.fn.readfile('src/new.py'), '\n') .. '\n'
  wait('new.py to be marked conflicted', function()
    for _, f in ipairs(state.proposals[second].files) do
      if f.path == 'src/new.py' then
        return f.state == 'conflicted'
      end
    end
  end, 10000)
  vim.cmd('Airlock reject all')
  wait('the follow-up to be rejected', function()
    return state.proposals[second].state == 'rejected'
  end, 30000)
  out.followup_state = state.proposals[second].state
  vim.cmd('edit!')
  vim.cmd.buffer(mod_buf)
end)

step(':Airlock undo of the first run reloads the buffer', function()
  vim.cmd('Airlock undo ' .. run_id)
  wait('the undo', function()
    return proposal().state == 'undone'
  end, 30000)
  wait('mod.py to reload', function()
    return lines(mod_buf) == out.mod_before
  end, 10000)
  out.mod_after_undo = lines(mod_buf)
  out.statusline_after_undo = airlock.statusline({ plain = true })
end)

step('shut down', function()
  local c = airlock.client()
  if c then
    c:stop()
    wait('the daemon to exit', function()
      return c:is_stopped()
    end, 15000)
  end
end)

save()
vim.cmd('qa!')
