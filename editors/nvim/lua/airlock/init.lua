-- airlock.nvim: start airlockd agent runs, follow them, and review their proposals hunk by hunk.
-- A buffer never changes before you accept; accepting goes through the daemon (airlock.approve).
local config = require('airlock.config')
local state = require('airlock.state')
local lsp = require('airlock.lsp')

local M = {}

local function highlights()
  local set = function(name, link)
    vim.api.nvim_set_hl(0, name, { link = link, default = true })
  end
  set('AirlockAdd', 'DiffAdd')
  set('AirlockDelete', 'DiffDelete')
  set('AirlockSign', 'DiffChange')
  set('AirlockHint', 'Comment')
  set('AirlockDenied', 'ErrorMsg')
  set('AirlockStatusWarn', 'WarningMsg')
  set('AirlockStatusError', 'ErrorMsg')
end

--- Register the server and the review machinery. See :help airlock-setup.
function M.setup(opts)
  config.set(opts)
  highlights()
  local group = vim.api.nvim_create_augroup('airlock', { clear = true })
  vim.api.nvim_create_autocmd('ColorScheme', { group = group, callback = highlights })
  -- A buffer opened while a review is on shows its hunks and gets its keys.
  vim.api.nvim_create_autocmd({ 'BufReadPost', 'BufNewFile', 'BufWritePost' }, {
    group = group,
    callback = function(ev)
      if state.active_proposal() then
        vim.schedule(function()
          require('airlock.review').render(ev.buf)
        end)
      end
    end,
  })
  lsp.register()
  return M
end

--- The statusline component: state, elapsed, cpu, memory vs limit, tokens; "reviewing N hunks in
--- M files"; quarantine (error highlight). opts.plain: text without highlight markup.
function M.statusline(opts)
  return require('airlock.status').statusline(opts)
end

--- The status as data { kind, level, text }.
function M.status()
  return require('airlock.status').compute()
end

--- Start a run: { agent?, prompt?, followUp?, mode? }; pickers ask for what is missing.
function M.run(opts, cb)
  return require('airlock.commands').run(opts, cb)
end

function M.review(run_id, cb)
  return require('airlock.review').review(run_id, cb)
end

--- verb 'accept'|'reject', scope 'hunk'|'file'|'all', path for 'file'.
function M.decide(verb, scope, path, cb)
  return require('airlock.review').decide(verb, scope, path, cb)
end

function M.diff(path)
  return require('airlock.review').diff(path)
end

M.state = state
M.command = lsp.command
M.command_sync = lsp.command_sync
M.client = lsp.client

return M
