-- The statusline text: what airlockd is doing now, from the cached notifications.
local state = require('airlock.state')
local config = require('airlock.config')
local esc = require('airlock.escape')

local M = {}

local function mib(bytes)
  return math.floor((bytes or 0) / 1048576 + 0.5)
end

local function duration(s)
  s = math.floor(s or 0)
  if s < 60 then
    return s .. 's'
  end
  if s < 3600 then
    return string.format('%dm%02ds', math.floor(s / 60), s % 60)
  end
  return string.format('%dh%02dm', math.floor(s / 3600), math.floor(s % 3600 / 60))
end
M.duration = duration

local function limits_of(agent)
  local a = agent and state.agents[agent]
  return a and type(a.limits) == 'table' and a.limits or {}
end

--- The current status as data: { kind, text, level } where kind is idle|running|reviewing|ended
--- and level is 'ok'|'warn'|'error' (error: an agent is quarantined).
function M.compute()
  local parts, level, kind = {}, 'ok', 'idle'
  local live = state.live_run()
  local review = state.active_proposal()
  if live then
    kind = 'running'
    local lim = limits_of(live.agent)
    local elapsed = (live.elapsedS or 0)
    if live.state == 'running' or live.state == 'staging' or live.state == 'inspecting' then
      elapsed = elapsed + math.max(0, state.now() - (live.receivedAt or state.now()))
    end
    local s = string.format('%s %s %s', live.agent or '?', live.state, duration(elapsed))
    s = s .. string.format(' · cpu %d%%', math.floor((live.cpuPct or 0) + 0.5))
    if lim.memory_mb then
      s = s .. string.format(' · mem %d/%dM', mib(live.memBytes), lim.memory_mb)
    else
      s = s .. string.format(' · mem %dM', mib(live.memBytes))
    end
    s = s .. string.format(' · %d tok', live.tokens or 0)
    table.insert(parts, s)
    local ratio = config.values.warn_ratio or 0.8
    if
      (lim.memory_mb and mib(live.memBytes) > ratio * lim.memory_mb)
      or (lim.cpus and (live.cpuPct or 0) > ratio * lim.cpus * 100)
      or (lim.wall_time_s and elapsed > ratio * lim.wall_time_s)
    then
      level = 'warn'
    end
  elseif review then
    kind = 'reviewing'
    local h, f = state.pending_counts(review)
    table.insert(parts, string.format('reviewing %d hunk%s in %d file%s', h, h == 1 and '' or 's', f, f == 1 and '' or 's'))
  else
    local last = state.last_run and state.runs[state.last_run]
    if last and last.state then
      kind = 'ended'
      table.insert(parts, string.format('%s %s', last.agent or '?', last.state))
    else
      table.insert(parts, 'idle')
    end
  end
  local names = vim.tbl_keys(state.agents)
  table.sort(names)
  for _, name in ipairs(names) do
    local a = state.agents[name]
    if a.quarantined then
      level = 'error'
      table.insert(parts, string.format('%s QUARANTINED%s', name, a.reason and a.reason ~= vim.NIL and (': ' .. esc.display(a.reason)) or ''))
    end
  end
  return { kind = kind, level = level, text = 'airlock: ' .. table.concat(parts, ' | ') }
end

local HL = { warn = 'AirlockStatusWarn', error = 'AirlockStatusError' }

--- The statusline string. opts.plain: no highlight markup and no %-escaping (for echo, tests).
function M.statusline(opts)
  opts = opts or {}
  local s = M.compute()
  if opts.plain then
    return s.text
  end
  local text = s.text:gsub('%%', '%%%%')
  local hl = HL[s.level]
  if hl then
    return '%#' .. hl .. '#' .. text .. '%*'
  end
  return text
end

return M
