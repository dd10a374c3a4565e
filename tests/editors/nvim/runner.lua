-- The small runner of the plugin's Lua specs (unit.lua, shown.lua): each `it` is run in order; the
-- results are written to AIRLOCK_OUT as JSON and the exit code is the number of failures.
local M = { results = {} }

function M.it(name, fn)
  local ok, err = xpcall(fn, debug.traceback)
  table.insert(M.results, { name = name, ok = ok, error = not ok and err or nil })
end

function M.eq(want, got, what)
  if not vim.deep_equal(want, got) then
    error(string.format('%s: want %s, got %s', what or 'value', vim.inspect(want), vim.inspect(got)), 2)
  end
end

function M.finish()
  local f = assert(io.open(vim.env.AIRLOCK_OUT, 'w'))
  f:write(vim.json.encode(M.results))
  f:close()
  local failed = 0
  for _, r in ipairs(M.results) do
    if not r.ok then
      failed = failed + 1
      io.stderr:write('FAIL ' .. r.name .. '\n' .. r.error .. '\n')
    end
  end
  os.exit(failed)
end

return M
