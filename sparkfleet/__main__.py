from sparkfleet.cli import main

raise SystemExit(main())
