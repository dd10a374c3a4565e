-- :Airlock {subcommand} — every action from the keyboard, with completion.
local esc = require('airlock.escape')
local state = require('airlock.state')
local lsp = require('airlock.lsp')
local review = require('airlock.review')
local status = require('airlock.status')

local M = {}

local function notify(msg, level)
  vim.notify('airlock: ' .. msg, level or vim.log.levels.INFO)
end

local function current_run()
  local live = state.live_run()
  if live then
    return live.runId
  end
  return state.review_run or state.last_run
end

local function with_agents(cb)
  lsp.command('listAgents', {}, function(err, agents)
    if not err then
      state.set_agents(agents)
      cb(agents or {})
    end
  end)
end

--- Start a run. opts: { agent?, prompt?, followUp?, mode? }; asks for what is missing.
function M.run(opts, cb)
  opts = opts or {}
  local function start(agent, prompt)
    if not prompt or vim.trim(prompt) == '' then
      return notify('no prompt, nothing started', vim.log.levels.WARN)
    end
    local args = { agent = agent, prompt = prompt, followUp = opts.followUp, mode = opts.mode }
    lsp.command('runTask', args, function(err, res)
      if not err and res then
        state.on_run_started(res.runId, agent, res.state)
        state.add_log('info', string.format('run %s (%s) %s', res.runId, agent, res.state))
        notify(string.format('run %s (%s) %s', res.runId, agent, res.state))
        lsp.fire()
        lsp.tick()
      end
      if cb then
        cb(err, res)
      end
    end)
  end
  local function ask_prompt(agent)
    if opts.prompt then
      return start(agent, opts.prompt)
    end
    vim.ui.input({ prompt = string.format('airlock task for %s: ', agent) }, function(text)
      start(agent, text)
    end)
  end
  if opts.agent then
    return ask_prompt(opts.agent)
  end
  with_agents(function(agents)
    if #agents == 0 then
      return notify('no agents in policies.toml', vim.log.levels.WARN)
    end
    vim.ui.select(agents, {
      prompt = 'airlock agent',
      format_item = function(a)
        local s = string.format('%s (%s, %s)', a.agent, a.adapter or '?', a.mode or '?')
        if a.quarantined then
          s = s .. ' QUARANTINED'
        end
        return s
      end,
    }, function(choice)
      if choice then
        ask_prompt(choice.agent)
      end
    end)
  end)
end

function M.followup(prompt, cb)
  local id = state.review_run or state.last_run
  local r = id and state.runs[id]
  if not r then
    return notify('no earlier run to follow up (:Airlock run)', vim.log.levels.WARN)
  end
  M.run({ agent = r.agent, prompt = prompt, followUp = id }, cb)
end

local function show_lines(name, lines, ft)
  local b = review.scratch(name, lines, ft)
  vim.cmd('botright split')
  vim.api.nvim_win_set_buf(0, b)
  return b
end
M.show_lines = show_lines

function M.status()
  lsp.command('listRuns', { limit = 15 }, function(err, runs)
    if err then
      return
    end
    local lines = { status.statusline({ plain = true }), '' }
    table.sort(runs, function(a, b)
      return (a.createdAt or 0) > (b.createdAt or 0)
    end)
    for i, r in ipairs(runs) do
      if i > 15 then
        break
      end
      local review_counts = {}
      for k, v in pairs(type(r.review) == 'table' and r.review or {}) do
        table.insert(review_counts, k .. ' ' .. v)
      end
      table.insert(lines, string.format('%s  %-8s %-14s %s  %s', r.runId, r.agent, r.state, os.date('%Y-%m-%d %H:%M', math.floor(r.createdAt or 0)), table.concat(review_counts, ', ')))
    end
    vim.api.nvim_echo({ { table.concat(lines, '\n') } }, true, {})
  end)
end

local function pretty(value, indent, out, key)
  indent = indent or ''
  out = out or {}
  local prefix = indent .. (key and (esc.display(key) .. ': ') or '')
  if type(value) == 'table' and value ~= vim.NIL then
    if vim.tbl_isempty(value) then
      table.insert(out, prefix .. (vim.islist(value) and '[]' or '{}'))
    elseif vim.islist(value) then
      table.insert(out, prefix:sub(1, -2))
      for _, v in ipairs(value) do
        pretty(v, indent .. '  - ', out)
      end
    else
      if key then
        table.insert(out, prefix:sub(1, -2))
      end
      local keys = vim.tbl_keys(value)
      table.sort(keys)
      for _, k in ipairs(keys) do
        pretty(value[k], key and (indent .. '  ') or indent, out, k)
      end
    end
  else
    local s = value == vim.NIL and 'null' or tostring(value)
    for i, l in ipairs(vim.split(s, '\n', { plain = true })) do
      table.insert(out, (i == 1 and prefix or indent .. '  ') .. esc.escape(l, '\t'))
    end
  end
  return out
end
M.pretty = pretty

function M.evidence(run_id)
  run_id = run_id ~= '' and run_id or current_run()
  if not run_id then
    return notify('no run', vim.log.levels.WARN)
  end
  lsp.command('getEvidence', { runId = run_id }, function(err, ev)
    if err or not ev then
      return
    end
    if type(ev.policy) == 'table' then
      ev.policy.snapshot = ev.policy.snapshot ~= vim.NIL and '(' .. #tostring(ev.policy.snapshot) .. ' bytes)' or nil
    end
    show_lines('airlock://evidence/' .. run_id, pretty(ev), 'yaml')
  end)
end

function M.log()
  local lines = {}
  for _, e in ipairs(state.log) do
    table.insert(lines, string.format('%s %-5s %s', e.time, e.level, esc.display((e.text:gsub('\n', ' ')))))
  end
  table.insert(lines, '')
  table.insert(lines, 'LSP log: ' .. vim.lsp.get_log_path())
  show_lines('airlock://log', lines, nil)
end

local function decided(verb)
  return function(args)
    local scope = args[1] or 'hunk'
    local path = args[2]
    review.decide(verb, scope, path)
  end
end

local function run_arg(args)
  return args[1] or current_run()
end

M.subcommands = {
  run = function(args)
    local agent = args[1]
    local prompt = #args > 1 and table.concat(args, ' ', 2) or nil
    M.run({ agent = agent, prompt = prompt })
  end,
  followup = function(args)
    M.followup(#args > 0 and table.concat(args, ' ') or nil)
  end,
  status = function()
    M.status()
  end,
  review = function(args)
    review.review(args[1])
  end,
  diff = function(args)
    review.diff(args[1])
  end,
  accept = decided('accept'),
  reject = decided('reject'),
  undo = function(args)
    local id = args[1] or state.review_run or state.last_run
    if not id then
      return notify('no run to undo', vim.log.levels.WARN)
    end
    lsp.command('undo', { runId = id }, function(err, res)
      if not err and res then
        local p = state.proposals[id]
        local paths = {}
        for _, f in ipairs(p and p.files or {}) do
          table.insert(paths, f.path)
        end
        review.reload(paths)
        notify(string.format('run %s %s', res.runId, res.state))
      end
    end)
  end,
  stop = function(args)
    local id = run_arg(args)
    if id then
      lsp.command('stopRun', { runId = id }, function(err, res)
        if not err then
          notify(string.format('run %s %s', res.runId, res.state))
        end
      end)
    end
  end,
  kill = function(args)
    local id = run_arg(args)
    if id then
      lsp.command('killRun', { runId = id }, function(err, res)
        if not err then
          notify(string.format('run %s %s', res.runId, res.state))
        end
      end)
    end
  end,
  release = function(args)
    local function release(name)
      local ok = vim.fn.confirm(string.format('Lift the quarantine of agent %s?', name), '&Yes\n&No', 2)
      if ok == 1 then
        lsp.command('releaseAgent', { agent = name }, function(err, a)
          if not err then
            state.on_agent(a)
            lsp.fire()
            notify('released ' .. name)
          end
        end)
      end
    end
    if args[1] then
      return release(args[1])
    end
    with_agents(function(agents)
      local q = vim.tbl_filter(function(a)
        return a.quarantined
      end, agents)
      if #q == 0 then
        return notify('no agent is quarantined')
      end
      vim.ui.select(q, {
        prompt = 'release which agent',
        format_item = function(a)
          return a.agent .. ': ' .. esc.display(a.reason)
        end,
      }, function(choice)
        if choice then
          release(choice.agent)
        end
      end)
    end)
  end,
  evidence = function(args)
    M.evidence(args[1] or '')
  end,
  log = function()
    M.log()
  end,
  output = function()
    require('airlock.output').show()
  end,
}

local ORDER = { 'run', 'followup', 'status', 'review', 'diff', 'accept', 'reject', 'undo', 'stop', 'kill', 'release', 'evidence', 'output', 'log' }
M.ORDER = ORDER

function M.dispatch(opts)
  local args = opts.fargs
  local sub = table.remove(args, 1) or 'status'
  local fn = M.subcommands[sub]
  if not fn then
    return notify('unknown subcommand ' .. sub .. ' (one of ' .. table.concat(ORDER, ', ') .. ')', vim.log.levels.ERROR)
  end
  fn(args)
end

local function matching(list, lead)
  return vim.tbl_filter(function(x)
    return vim.startswith(x, lead)
  end, list)
end

local function pending_paths()
  local p = state.active_proposal()
  local out = {}
  for _, f in ipairs(p and p.files or {}) do
    if f.state == 'pending' or f.state == 'conflicted' then
      table.insert(out, f.path)
    end
  end
  return out
end

function M.complete(lead, line, _)
  local words = vim.split(line:sub(1, #line - #lead), '%s+', { trimempty = true })
  local n = #words -- words before the one being completed (the first is the command)
  if n <= 1 then
    return matching(ORDER, lead)
  end
  local sub = words[2]
  if n == 2 then
    if sub == 'accept' or sub == 'reject' then
      return matching({ 'hunk', 'file', 'all' }, lead)
    elseif sub == 'run' or sub == 'release' then
      local names = vim.tbl_keys(state.agents)
      table.sort(names)
      return matching(names, lead)
    elseif sub == 'review' or sub == 'evidence' or sub == 'stop' or sub == 'kill' or sub == 'undo' then
      local ids = {}
      for i = #state.order, 1, -1 do
        table.insert(ids, state.order[i])
      end
      return matching(ids, lead)
    elseif sub == 'diff' then
      return matching(pending_paths(), lead)
    end
  elseif n == 3 and (sub == 'accept' or sub == 'reject') and words[3] == 'file' then
    return matching(pending_paths(), lead)
  end
  return {}
end

return M
