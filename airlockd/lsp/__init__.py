"""The LSP daemon: `airlockd serve`. See docs/lsp.md."""
