-- airlock.nvim: review airlockd agent runs in Neovim. Configure with require('airlock').setup().
if vim.g.loaded_airlock then
  return
end
vim.g.loaded_airlock = true

vim.api.nvim_create_user_command('Airlock', function(opts)
  require('airlock.commands').dispatch(opts)
end, {
  nargs = '*',
  desc = 'airlockd: run, review and decide agent changes',
  complete = function(lead, line, pos)
    return require('airlock.commands').complete(lead, line, pos)
  end,
})
