from airlockd.cli import main

raise SystemExit(main())
