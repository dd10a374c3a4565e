-- Inline review: pending hunks drawn on the real buffer (never modified), buffer-local keys while
-- something is pending, accept/reject through airlock.approve / airlock.reject, reload after.
-- Paths, rules, reasons and proposed text are shown escaped (airlock.escape); a change's marks
-- head its banner and its quickfix entries.
local config = require('airlock.config')
local esc = require('airlock.escape')
local state = require('airlock.state')
local lsp = require('airlock.lsp')

local M = {}
local ns = vim.api.nvim_create_namespace('airlock')
M.ns = ns

-- -- paths and buffers --------------------------------------------------------------------------

local function real(path)
  return vim.uv.fs_realpath(path) or vim.fs.normalize(path)
end

--- The workspace-relative path of a buffer, or nil when it is outside the workspace.
function M.path_of(bufnr)
  local name = vim.api.nvim_buf_get_name(bufnr)
  if name == '' or vim.bo[bufnr].buftype ~= '' then
    return nil
  end
  local root = lsp.root()
  local abs = vim.fs.normalize(name)
  local dir = real(vim.fs.dirname(abs))
  abs = dir .. '/' .. vim.fs.basename(abs)
  if vim.startswith(abs, root .. '/') then
    return abs:sub(#root + 2)
  end
end

function M.abs(path)
  return lsp.root() .. '/' .. path
end

--- The loaded buffer showing workspace path `path`, if any.
function M.buf_of(path)
  for _, b in ipairs(vim.api.nvim_list_bufs()) do
    if vim.api.nvim_buf_is_loaded(b) and M.path_of(b) == path then
      return b
    end
  end
end

local function hunks_of(f)
  return type(f.hunks) == 'table' and f.hunks or {}
end

local function file_of(p, path)
  for _, f in ipairs(p and p.files or {}) do
    if f.path == path then
      return f
    end
  end
end

local function denied_of(p, path)
  for _, d in ipairs(p and p.denied or {}) do
    if d.path == path then
      return d
    end
  end
end

local function split(text)
  local out = vim.split(text or '', '\n', { plain = true })
  if out[#out] == '' then
    table.remove(out)
  end
  return out
end

--- Pending hunks of file `f` (in order), each { hunk, index, total }.
function M.pending_hunks(f)
  local out = {}
  if not f or f.state ~= 'pending' then
    return out
  end
  for _, h in ipairs(hunks_of(f)) do
    if h.state == 'pending' then
      table.insert(out, h)
    end
  end
  return out
end

--- Does buffer `bufnr` have anything pending in the active review?
function M.buffer_pending(bufnr)
  local p = state.active_proposal()
  local path = M.path_of(bufnr)
  local f = path and file_of(p, path)
  return f ~= nil and f.state == 'pending'
end

-- -- drawing ---------------------------------------------------------------------------------

-- A proposed line as virtual text: escaped (a CRLF ending is a line ending, not shown), tabs
-- expanded.
local function expand(line)
  return (esc.escape(line:gsub('\r$', ''), '\t'):gsub('\t', string.rep(' ', vim.o.tabstop)))
end

local function draw_hunk(bufnr, h, i, total, decision)
  local signs = config.values.signs
  local count = vim.api.nvim_buf_line_count(bufnr)
  local s = h.range.start.line
  local n = h.oldLines or 0
  local new = split(h.newText)
  local virt = {}
  for _, l in ipairs(new) do
    table.insert(virt, { { '+ ' .. expand(l), 'AirlockAdd' } })
  end
  local keys = config.values.keys or {}
  local hint = string.format(' airlock %d/%d (%s)', i, total, decision or '?')
  if keys.accept_hunk and keys.reject_hunk then
    hint = hint .. string.format(' %s accept · %s reject', keys.accept_hunk, keys.reject_hunk)
  end
  if n > 0 then
    for row = s, math.min(s + n, count) - 1 do
      vim.api.nvim_buf_set_extmark(bufnr, ns, row, 0, {
        line_hl_group = 'AirlockDelete',
        sign_text = #new > 0 and signs.change or signs.delete,
        sign_hl_group = 'AirlockSign',
        virt_text = row == s and { { hint, 'AirlockHint' } } or nil,
        virt_text_pos = 'eol',
        priority = 200,
      })
    end
    local last = math.min(s + n, count) - 1
    if #virt > 0 and last >= 0 then
      vim.api.nvim_buf_set_extmark(bufnr, ns, last, 0, { virt_lines = virt, priority = 200 })
    end
  else
    local row, above = s, true
    if s >= count then
      row, above = count - 1, false
    end
    vim.api.nvim_buf_set_extmark(bufnr, ns, row, 0, {
      virt_lines = virt,
      virt_lines_above = above,
      sign_text = signs.add,
      sign_hl_group = 'AirlockSign',
      virt_text = { { hint, 'AirlockHint' } },
      virt_text_pos = 'eol',
      priority = 200,
    })
  end
end

local function banner(bufnr, lines, hl)
  local virt = {}
  for _, text in ipairs(lines) do
    table.insert(virt, { { text, hl } })
  end
  vim.api.nvim_buf_set_extmark(bufnr, ns, 0, 0, {
    virt_lines = virt,
    virt_lines_above = true,
    sign_text = config.values.signs.denied,
    sign_hl_group = hl,
  })
end

--- Draw what is pending for buffer `bufnr` (clears it first). Never touches the text.
function M.render(bufnr)
  if not vim.api.nvim_buf_is_valid(bufnr) then
    return
  end
  vim.api.nvim_buf_clear_namespace(bufnr, ns, 0, -1)
  local p = state.active_proposal()
  local path = M.path_of(bufnr)
  if p and path and config.values.inline then
    local d = denied_of(p, path)
    if d then
      local text = string.format('airlock: %s change denied by %s — %s (not offered)', d.change, esc.display(d.rule), esc.display(d.reason))
      banner(bufnr, vim.list_extend({ text }, esc.marks(d)), 'AirlockDenied')
    end
    local f = file_of(p, path)
    if f and f.state == 'conflicted' then
      local text = 'airlock: conflicted (the file changed after the run) — it can only be rejected'
      banner(bufnr, vim.list_extend({ text }, esc.marks(f)), 'AirlockDenied')
    elseif f and f.state == 'pending' then
      local pend, marks = M.pending_hunks(f), esc.marks(f)
      if #hunks_of(f) == 0 then
        local text = string.format('airlock: %s %s pending (%s: %s)', f.change, f.binary and 'binary file' or 'file', f.decision, esc.display(f.rule))
        banner(bufnr, vim.list_extend({ text }, marks), #marks > 0 and 'AirlockDenied' or 'AirlockHint')
      elseif #marks > 0 then
        banner(bufnr, marks, 'AirlockDenied')
      end
      for i, h in ipairs(pend) do
        draw_hunk(bufnr, h, i, #pend, f.decision)
      end
    end
  end
  M.update_keys(bufnr)
end

function M.render_all()
  for _, b in ipairs(vim.api.nvim_list_bufs()) do
    if vim.api.nvim_buf_is_loaded(b) and vim.bo[b].buftype == '' then
      M.render(b)
    end
  end
end

-- -- keys ------------------------------------------------------------------------------------

local PLUGS = {
  next_hunk = { '<Plug>(airlock-next-hunk)', function() M.jump(1) end, 'airlock: next pending hunk' },
  prev_hunk = { '<Plug>(airlock-prev-hunk)', function() M.jump(-1) end, 'airlock: previous pending hunk' },
  accept_hunk = { '<Plug>(airlock-accept-hunk)', function() M.decide('accept', 'hunk') end, 'airlock: accept the hunk at the cursor' },
  reject_hunk = { '<Plug>(airlock-reject-hunk)', function() M.decide('reject', 'hunk') end, 'airlock: reject the hunk at the cursor' },
  accept_file = { '<Plug>(airlock-accept-file)', function() M.decide('accept', 'file') end, 'airlock: accept this file' },
  reject_file = { '<Plug>(airlock-reject-file)', function() M.decide('reject', 'file') end, 'airlock: reject this file' },
}
M.PLUGS = PLUGS

--- Buffer-local mappings exist exactly while the buffer has something pending.
function M.update_keys(bufnr)
  local want = M.buffer_pending(bufnr)
  local have = vim.b[bufnr].airlock_keys
  if want and not have then
    local set = {}
    for name, spec in pairs(PLUGS) do
      vim.keymap.set('n', spec[1], spec[2], { buffer = bufnr, desc = spec[3] })
      table.insert(set, spec[1])
      local lhs = config.values.keys and config.values.keys[name]
      if lhs and vim.fn.maparg(lhs, 'n', false, true).buffer ~= 1 then
        vim.keymap.set('n', lhs, spec[1], { buffer = bufnr, remap = true, desc = spec[3] })
        table.insert(set, lhs)
      end
    end
    vim.b[bufnr].airlock_keys = set
  elseif have and not want then
    for _, lhs in ipairs(have) do
      pcall(vim.keymap.del, 'n', lhs, { buffer = bufnr })
    end
    vim.b[bufnr].airlock_keys = nil
  end
end

-- -- navigation ------------------------------------------------------------------------------

local function current()
  local p = state.active_proposal()
  local bufnr = vim.api.nvim_get_current_buf()
  local path = M.path_of(bufnr)
  return p, path, path and file_of(p, path), bufnr
end

--- The pending hunk at line `row` (0-based) of file `f`.
function M.hunk_at(f, row)
  for _, h in ipairs(M.pending_hunks(f)) do
    local s, n = h.range.start.line, h.oldLines or 0
    if (n > 0 and row >= s and row < s + n) or (n == 0 and (row == s or row == s - 1)) then
      return h
    end
  end
end

function M.jump(dir)
  local _, _, f = current()
  local rows = {}
  for _, h in ipairs(M.pending_hunks(f)) do
    table.insert(rows, h.range.start.line)
  end
  if #rows == 0 then
    return vim.notify('airlock: no pending hunk in this buffer', vim.log.levels.INFO)
  end
  local row = vim.api.nvim_win_get_cursor(0)[1] - 1
  local target
  if dir > 0 then
    for _, r in ipairs(rows) do
      if r > row then
        target = target or r
      end
    end
    target = target or rows[1]
  else
    for i = #rows, 1, -1 do
      if rows[i] < row then
        target = target or rows[i]
      end
    end
    target = target or rows[#rows]
  end
  local count = vim.api.nvim_buf_line_count(0)
  vim.api.nvim_win_set_cursor(0, { math.min(target + 1, count), 0 })
end

-- -- deciding --------------------------------------------------------------------------------

--- Reload buffers of `paths` that have no unsaved changes (:checktime; autoread reloads them).
function M.reload(paths)
  for _, path in ipairs(paths or {}) do
    local b = M.buf_of(path)
    if b and not vim.bo[b].modified then
      pcall(vim.cmd.checktime, b)
      -- checktime misses a rewrite within the same mtime tick and size: compare and reload.
      local ok, disk = pcall(vim.fn.readfile, M.abs(path))
      if ok and not vim.bo[b].modified then
        local lines = vim.api.nvim_buf_get_lines(b, 0, -1, false)
        if not vim.deep_equal(lines, disk) then
          vim.api.nvim_buf_call(b, function()
            vim.cmd('silent! edit!')
          end)
        end
      end
    end
  end
end

local function selection_path(arg)
  if arg and arg ~= '' then
    return arg
  end
  if vim.bo.buftype == 'quickfix' then
    local items = vim.fn.getqflist()
    local it = items[vim.fn.line('.')]
    if it and it.bufnr > 0 then
      return M.path_of(it.bufnr)
    end
  end
  return M.path_of(vim.api.nvim_get_current_buf())
end

--- Pending files of `p` whose change the daemon marked (look-alike name, hidden characters, …).
function M.marked(p)
  return vim.tbl_filter(function(f)
    return f.state == 'pending' and #esc.marks(f) > 0
  end, p and p.files or {})
end

--- Ask `question` (accepting a whole run with marked files); true to go on. The specs replace it.
function M.confirm(question)
  return vim.fn.confirm(question, '&Accept all\n&Cancel', 2, 'Warning') == 1
end

local function accept_all_question(p, marked)
  local lines = { string.format('Accept everything pending in run %s, %d marked file%s included?', p.runId, #marked, #marked == 1 and '' or 's') }
  for _, f in ipairs(marked) do
    table.insert(lines, esc.display(f.path))
    for _, m in ipairs(esc.marks(f)) do
      table.insert(lines, '  ' .. m)
    end
  end
  return table.concat(lines, '\n')
end

--- Accept or reject: scope 'hunk' (at the cursor), 'file' (path arg, quickfix item or this buffer)
--- or 'all' (accepting a run with marked files asks first: M.confirm). cb(err, result) when the
--- daemon answered.
function M.decide(verb, scope, arg, cb)
  local p = state.active_proposal()
  local function fail(msg)
    vim.notify('airlock: ' .. msg, vim.log.levels.WARN)
    if cb then
      cb({ message = msg }, nil)
    end
  end
  if not p then
    return fail('no review in progress (:Airlock review)')
  end
  local args = { runId = p.runId }
  local what
  if scope == 'hunk' then
    local _, path, f, _ = current()
    if not path or not f then
      return fail('this buffer has no pending change')
    end
    local h = M.hunk_at(f, vim.api.nvim_win_get_cursor(0)[1] - 1)
    if not h then
      return fail('no pending hunk at the cursor (]h / [h move to one)')
    end
    args.hunks = { [path] = { h.id } }
    what = string.format('hunk at line %d of %s', h.range.start.line + 1, esc.display(path))
  elseif scope == 'file' then
    local path = selection_path(arg)
    if not path then
      return fail('which file? (:Airlock ' .. verb .. ' file PATH)')
    end
    local d = denied_of(p, path)
    if d and verb == 'accept' then
      return fail(string.format('%s was denied by %s and cannot be accepted', esc.display(path), esc.display(d.rule)))
    end
    local f = file_of(p, path)
    if not f or (f.state ~= 'pending' and not (verb == 'reject' and f.state == 'conflicted')) then
      return fail(esc.display(path) .. ' has nothing pending in run ' .. p.runId)
    end
    args.paths = { path }
    what = esc.display(path)
  elseif scope == 'all' then
    what = 'everything pending'
    local marked = verb == 'accept' and M.marked(p) or {}
    if #marked > 0 and not M.confirm(accept_all_question(p, marked)) then
      return fail('nothing accepted (run ' .. p.runId .. ' has marked files)')
    end
  else
    return fail('accept/reject take hunk, file or all')
  end
  local name = verb == 'accept' and 'approve' or 'reject'
  lsp.command(name, args, function(err, res)
    if not err and res then
      if verb == 'accept' then
        M.reload(res.applied)
        if type(res.conflicts) == 'table' and #res.conflicts > 0 then
          vim.notify('airlock: conflicted: ' .. esc.display_all(res.conflicts), vim.log.levels.WARN)
        end
      end
      state.add_log('info', string.format('%s %s: run %s is %s', verb == 'accept' and 'accepted' or 'rejected', what, res.runId, res.state))
      vim.notify(string.format('airlock: %s %s (run %s)', verb == 'accept' and 'accepted' or 'rejected', what, res.state), vim.log.levels.INFO)
    end
    if cb then
      cb(err, res)
    end
  end)
end

-- -- proposals -------------------------------------------------------------------------------

local function signature(f)
  local s = f.state
  for _, h in ipairs(hunks_of(f)) do
    s = s .. ',' .. h.state
  end
  return s
end

--- A quickfix item of change `c` (file or denied): its marks lead the text; a path with hidden
--- characters is shown escaped (`module`) while the item still opens the file itself.
local function qf_item(c, lnum, type_, text)
  local marks = esc.marks(c)
  table.insert(marks, text)
  local shown = esc.display(c.path)
  return { filename = M.abs(c.path), module = shown ~= c.path and shown or nil, lnum = lnum, type = type_, text = table.concat(marks, ' · ') }
end

function M.quickfix_items(p)
  local items = {}
  for _, f in ipairs(p.files or {}) do
    local rule = esc.display(f.rule)
    if f.state == 'pending' then
      local hs = M.pending_hunks(f)
      if #hunks_of(f) == 0 then
        table.insert(items, qf_item(f, 1, 'I', string.format('%s%s (%s: %s) — pending', f.change, f.binary and ' binary' or '', f.decision, rule)))
      end
      for i, h in ipairs(hs) do
        table.insert(items, qf_item(f, h.range.start.line + 1, 'I', string.format('hunk %d/%d: -%d +%d (%s: %s)', i, #hs, h.oldLines, h.newLines, f.decision, rule)))
      end
    elseif f.state == 'conflicted' then
      table.insert(items, qf_item(f, 1, 'W', 'conflicted: the file changed after the run; reject only'))
    end
  end
  for _, d in ipairs(p.denied or {}) do
    table.insert(items, qf_item(d, 1, 'E', string.format('denied by %s: %s (%s; not offered)', esc.display(d.rule), esc.display(d.reason), d.change)))
  end
  return items
end

local function ours_qf()
  local t = vim.fn.getqflist({ title = 0 }).title or ''
  return vim.startswith(t, 'airlock')
end

function M.set_quickfix(p, action)
  vim.fn.setqflist({}, action or ' ', { title = 'airlock review ' .. p.runId, items = M.quickfix_items(p) })
end

--- A proposal arrived (airlock/proposal or getProposal): redraw, rekey, reload what changed.
function M.on_proposal(p, before)
  M.render_all()
  local changed = {}
  local old = {}
  for _, f in ipairs(before and before.files or {}) do
    old[f.path] = signature(f)
  end
  for _, f in ipairs(p.files or {}) do
    if before and old[f.path] ~= signature(f) then
      table.insert(changed, f.path)
    end
  end
  if p.state == 'undone' then
    for _, f in ipairs(p.files or {}) do
      table.insert(changed, f.path)
    end
  end
  M.reload(changed)
  if config.values.quickfix and ours_qf() then
    M.set_quickfix(p, 'r')
  end
  if p.state == 'proposed' and (not before or before.state ~= 'proposed') then
    local h, f = state.pending_counts(p)
    vim.notify(string.format('airlock: run %s proposes %d hunks in %d files (:Airlock review)', p.runId, h, f), vim.log.levels.INFO)
    if config.values.open_on_proposal then
      M.review(p.runId)
    end
  end
end

--- Start reviewing run `run_id` (default: the proposal under review, else the newest proposed run).
function M.review(run_id, cb)
  local function open(id)
    lsp.command('getProposal', { runId = id }, function(err, p)
      if err or not p then
        return cb and cb(err, nil)
      end
      local before = state.proposals[p.runId]
      state.on_proposal(p)
      M.on_proposal(p, before)
      if p.state ~= 'proposed' then
        vim.notify(string.format('airlock: run %s is %s; nothing to review', p.runId, p.state), vim.log.levels.INFO)
      elseif config.values.quickfix then
        M.set_quickfix(p)
        if #vim.fn.getqflist() > 0 then
          pcall(vim.cmd, 'silent cfirst')
        end
      end
      lsp.fire()
      if cb then
        cb(nil, p)
      end
    end)
  end
  if run_id and run_id ~= '' then
    return open(run_id)
  end
  if state.review_run then
    return open(state.review_run)
  end
  lsp.command('listRuns', { state = { 'proposed' }, limit = 1 }, function(err, runs)
    if err then
      return cb and cb(err, nil)
    end
    local newest
    for _, r in ipairs(runs or {}) do
      if r.state == 'proposed' and (not newest or r.createdAt > newest.createdAt) then
        newest = r
      end
    end
    if not newest then
      vim.notify('airlock: no run is waiting for review', vim.log.levels.INFO)
      return cb and cb({ message = 'nothing to review' }, nil)
    end
    open(newest.runId)
  end)
end

-- -- diff ------------------------------------------------------------------------------------

--- The text of buffer `bufnr` with every pending hunk of `f` applied (the proposal, live).
function M.proposed_lines(bufnr, f)
  local lines = vim.api.nvim_buf_get_lines(bufnr, 0, -1, false)
  local hs = M.pending_hunks(f)
  table.sort(hs, function(a, b)
    return a.range.start.line > b.range.start.line
  end)
  for _, h in ipairs(hs) do
    local s = h.range.start.line
    for _ = 1, h.oldLines or 0 do
      table.remove(lines, s + 1)
    end
    for i, l in ipairs(split(h.newText)) do
      table.insert(lines, s + i, l)
    end
  end
  return lines
end

local function scratch(name, lines, ft)
  local old = vim.fn.bufnr(name)
  if old > 0 then
    pcall(vim.api.nvim_buf_delete, old, { force = true })
  end
  local b = vim.api.nvim_create_buf(false, true)
  vim.api.nvim_buf_set_name(b, name)
  vim.api.nvim_buf_set_lines(b, 0, -1, false, lines)
  vim.bo[b].buftype = 'nofile'
  vim.bo[b].bufhidden = 'wipe'
  vim.bo[b].swapfile = false
  if ft and ft ~= '' then
    vim.bo[b].filetype = ft
  end
  vim.bo[b].modifiable = false
  return b
end
M.scratch = scratch

--- :Airlock diff [path]: the proposed text in a scratch buffer in diff mode beside the file.
function M.diff(arg)
  local p = state.active_proposal()
  if not p then
    return vim.notify('airlock: no review in progress (:Airlock review)', vim.log.levels.WARN)
  end
  local path = selection_path(arg)
  local f = path and file_of(p, path)
  if not f then
    return vim.notify('airlock: ' .. esc.display(path) .. ' is not part of run ' .. p.runId, vim.log.levels.WARN)
  end
  local bufnr = M.buf_of(path)
  if #hunks_of(f) > 0 and f.change == 'modified' then
    if not bufnr then
      vim.cmd.edit(vim.fn.fnameescape(M.abs(path)))
      bufnr = vim.api.nvim_get_current_buf()
    end
    local win = vim.fn.bufwinid(bufnr)
    if win == -1 then
      vim.cmd.buffer(bufnr)
      win = vim.api.nvim_get_current_win()
    end
    vim.api.nvim_set_current_win(win)
    -- the file's text as it would land, never escaped: Neovim draws control characters (^[) and
    -- most invisible ones (<200b>) by itself
    local lines = M.proposed_lines(bufnr, f)
    local sb = scratch('airlock://proposed/' .. p.runId .. '/' .. esc.display(path), lines, vim.bo[bufnr].filetype)
    vim.cmd('diffthis')
    vim.cmd('vertical rightbelow split')
    vim.api.nvim_win_set_buf(0, sb)
    vim.cmd('diffthis')
    vim.api.nvim_create_autocmd('BufWipeout', {
      buffer = sb,
      once = true,
      callback = function()
        vim.schedule(function()
          if vim.api.nvim_win_is_valid(win) then
            vim.api.nvim_win_call(win, function()
              vim.cmd('diffoff')
            end)
          end
        end)
      end,
    })
    return sb
  end
  lsp.command('diff', { runId = p.runId, path = path }, function(err, res)
    if err or not res then
      return
    end
    -- the daemon's diff, shown as `airlockd diff` prints it
    local lines = vim.tbl_map(function(l)
      return esc.escape(l, '\t')
    end, split(res.diff))
    local sb = scratch('airlock://diff/' .. p.runId .. '/' .. esc.display(path), lines, 'diff')
    vim.cmd('vertical rightbelow split')
    vim.api.nvim_win_set_buf(0, sb)
  end)
end

return M
