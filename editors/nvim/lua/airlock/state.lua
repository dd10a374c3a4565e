-- What the daemon told us: runs, agents, proposals. Only the daemon decides; this is a cache.
local M = {
  runs = {}, -- runId -> last airlock/runStatus (+ receivedAt, progress)
  order = {}, -- runIds in the order first heard of
  agents = {}, -- agent -> listAgents entry / airlock/agentStatus fields
  proposals = {}, -- runId -> last proposal
  review_run = nil, -- runId of the proposal under review
  last_run = nil, -- runId of the newest run we heard of
  log = {}, -- { time, level, text }
}

local LIVE = { admitted = true, staging = true, running = true, inspecting = true }
M.LIVE = LIVE

local function now()
  return vim.uv.now() / 1000
end
M.now = now

function M.is_live(state)
  return LIVE[state] == true
end

function M.add_log(level, text)
  table.insert(M.log, { time = os.date('%H:%M:%S'), level = level, text = text })
  if #M.log > 1000 then
    table.remove(M.log, 1)
  end
end

local function remember(run_id)
  if not M.runs[run_id] then
    M.runs[run_id] = { runId = run_id }
    table.insert(M.order, run_id)
  end
  M.last_run = run_id
  return M.runs[run_id]
end

function M.on_run_status(p)
  local r = remember(p.runId)
  for k, v in pairs(p) do
    r[k] = v
  end
  r.receivedAt = now()
  if not LIVE[p.state] then
    r.progress = nil
  end
end

function M.on_run_started(run_id, agent, state)
  local r = remember(run_id)
  r.agent = agent
  r.state = r.state or state
  r.receivedAt = r.receivedAt or now()
  r.elapsedS = r.elapsedS or 0
end

function M.on_progress(run_id, message)
  local r = M.runs[run_id]
  if r and message and message ~= '' then
    r.progress = message
  end
end

function M.on_agent(a)
  local name = a.agent
  if not name then
    return
  end
  local cur = M.agents[name] or {}
  for k, v in pairs(a) do
    cur[k] = v
  end
  M.agents[name] = cur
end

function M.set_agents(list)
  for _, a in ipairs(list or {}) do
    M.on_agent(a)
  end
end

function M.on_proposal(p)
  M.proposals[p.runId] = p
  local r = remember(p.runId)
  r.agent = p.agent
  r.state = p.state
  if p.state == 'proposed' then
    M.review_run = p.runId
  elseif M.review_run == p.runId then
    M.review_run = nil
  end
end

--- The newest run that is still live, if any.
function M.live_run()
  for i = #M.order, 1, -1 do
    local r = M.runs[M.order[i]]
    if r and LIVE[r.state] then
      return r
    end
  end
end

--- Pending review counts of a proposal: hunks (a change without hunks counts as one) and files.
function M.pending_counts(p)
  local hunks, files = 0, 0
  for _, f in ipairs(p and p.files or {}) do
    if f.state == 'pending' then
      local n = 0
      local has = false
      for _, h in ipairs(type(f.hunks) == 'table' and f.hunks or {}) do
        has = true
        if h.state == 'pending' then
          n = n + 1
        end
      end
      if not has then
        n = 1
      end
      if n > 0 then
        hunks, files = hunks + n, files + 1
      end
    end
  end
  return hunks, files
end

--- The proposal under review, when something in it is still pending.
function M.active_proposal()
  local p = M.review_run and M.proposals[M.review_run]
  if p and p.state == 'proposed' then
    return p
  end
end

function M.reset()
  M.runs, M.order, M.agents, M.proposals, M.log = {}, {}, {}, {}, {}
  M.review_run, M.last_run = nil, nil
end

return M
