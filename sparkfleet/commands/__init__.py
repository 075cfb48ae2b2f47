"""One module per `sparkfleet` subcommand, each with its `NAME`, `HELP`, `arguments(parser)` (the parser checks every
argument it can, before any plan) and `run(args)` (an exit code; `Refused` for a refusal). `sparkfleet/cli.py`
registers them all the same way. A module imports only light modules at its top (the parser and a refusal stay
cheap); the fleet's modules are imported inside `run`, after `cli.main` has let pyinfra's CLI patch the stdlib."""
