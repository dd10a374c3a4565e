-- Paths and agent-written text as a person is shown them: the port of airlockd/names.py's `escape`
-- and `display` (and of the VS Code extension's logic/escape.ts). Every character a terminal or an
-- editor acts on or does not draw (C0 and C1 controls, DEL, bidirectional controls, zero-width and
-- other format characters, line and paragraph separators, Hangul fillers, variation selectors,
-- private-use and unassigned code points of those blocks) is written as Python writes it (`\x1b`,
-- `\u202e`, `\U000e0001`), so it is seen and never acted on. For what the plugin shows (banners,
-- virtual text, quickfix text, messages, the statusline); never for a buffer's text or a file name
-- the plugin opens.
local M = {}

-- The code points of names.py's `_CANDIDATE` that its `_hidden` calls hidden (Unicode 14), sorted.
local HIDDEN = {
  { 0x0, 0x1F }, { 0x7F, 0x9F }, { 0xAD, 0xAD }, { 0x600, 0x605 }, { 0x61C, 0x61C }, { 0x6DD, 0x6DD },
  { 0x70F, 0x70F }, { 0x890, 0x891 }, { 0x8E2, 0x8E2 }, { 0x115F, 0x1160 }, { 0x17B4, 0x17B5 },
  { 0x180E, 0x180E }, { 0x200B, 0x200F }, { 0x2028, 0x202E }, { 0x2060, 0x206F }, { 0x3164, 0x3164 },
  { 0xD800, 0xF8FF }, { 0xFE00, 0xFE0F }, { 0xFEFF, 0xFEFF }, { 0xFFA0, 0xFFA0 }, { 0xFFF0, 0xFFFB },
  { 0xFFFE, 0xFFFF }, { 0x110BD, 0x110BD }, { 0x110CD, 0x110CD }, { 0x13430, 0x1343F },
  { 0x1BCA0, 0x1BCA3 }, { 0x1D173, 0x1D17A }, { 0xE0000, 0xE00FF }, { 0xE01F0, 0xE0FFF },
  { 0xF0000, 0x10FFFF },
}

local function hidden(cp)
  for _, r in ipairs(HIDDEN) do
    if cp < r[1] then
      return false
    elseif cp <= r[2] then
      return true
    end
  end
  return false
end

local SHORT = { [0x0A] = '\\n', [0x09] = '\\t', [0x0D] = '\\r' }

local function escape_cp(cp)
  if SHORT[cp] then
    return SHORT[cp]
  elseif cp < 0x100 then
    return string.format('\\x%02x', cp)
  elseif cp < 0x10000 then
    return string.format('\\u%04x', cp)
  end
  return string.format('\\U%08x', cp)
end

-- The code point at byte `i` of `s` and its length in bytes; nil for a byte that starts no UTF-8
-- sequence (it is written as `\xNN`). Encoded surrogates (CESU-8) decode as themselves.
local LEAD = { [2] = 0x20, [3] = 0x10, [4] = 0x08 } -- the lead byte's payload bits: b % LEAD[n]

local function decode(s, i)
  local b = s:byte(i)
  if b < 0x80 then
    return b, 1
  end
  local n = b >= 0xF0 and b <= 0xF4 and 4 or b >= 0xE0 and b < 0xF0 and 3 or b >= 0xC2 and b < 0xE0 and 2 or nil
  if not n then
    return nil, 1
  end
  local cp = b % LEAD[n]
  for k = 1, n - 1 do
    local c = s:byte(i + k)
    if not c or c < 0x80 or c > 0xBF then
      return nil, 1
    end
    cp = cp * 64 + c % 64
  end
  return cp, n
end

--- `s` with every hidden character written as its escape; the characters in `keep` (default
--- newline and tab) pass. nil and vim.NIL are ''; other non-strings are tostring'd.
function M.escape(s, keep)
  if s == nil or s == vim.NIL then
    return ''
  end
  s = type(s) == 'string' and s or tostring(s)
  keep = keep or '\n\t'
  if not s:find('[%z\1-\31\127-\255]') then
    return s -- printable ASCII: the common case
  end
  local out, i = {}, 1
  while i <= #s do
    local b = s:byte(i)
    if b >= 0x20 and b < 0x7F then
      local j = s:find('[%z\1-\31\127-\255]', i) or #s + 1
      table.insert(out, s:sub(i, j - 1))
      i = j
    else
      local cp, n = decode(s, i)
      local ch = s:sub(i, i + n - 1)
      if not cp then
        table.insert(out, string.format('\\x%02x', b))
      elseif hidden(cp) and not (cp < 0x80 and keep:find(ch, 1, true)) then
        table.insert(out, escape_cp(cp))
      else
        table.insert(out, ch)
      end
      i = i + n
    end
  end
  return table.concat(out)
end

--- One line for a person: a path, a rule, a reason, a mark (newlines and tabs escaped too).
-- Spaces that are not U+0020 (names.py `_SPACES`), as UTF-8: a name ending in one looks like
-- another name.
local SPACES = {
  { '\194\160', '\\xa0' }, { '\225\154\128', '\\u1680' }, { '\226\128\175', '\\u202f' },
  { '\226\129\159', '\\u205f' }, { '\227\128\128', '\\u3000' },
}

function M.display(s)
  local out = M.escape(s, '')
  for _, sp in ipairs(SPACES) do
    out = out:gsub(sp[1], sp[2])
  end
  return (out:gsub('\226\128([\128-\138])', function(b)
    return string.format('\\u%04x', 0x2000 + b:byte() - 0x80)
  end))
end

--- Paths for a message: each escaped, joined by ', '.
function M.display_all(list)
  local out = {}
  for _, p in ipairs(type(list) == 'table' and list or {}) do
    table.insert(out, M.display(p))
  end
  return table.concat(out, ', ')
end

--- A change's marks (`marks` of a file or denied change), each as '⚠ mark'.
function M.marks(change)
  local out = {}
  for _, m in ipairs(change and type(change.marks) == 'table' and change.marks or {}) do
    table.insert(out, '⚠ ' .. M.display(m))
  end
  return out
end

return M
