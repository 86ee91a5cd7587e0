"""The subcommands of `gpuscaler` (the parser is in `gpuscaler.cli`): a program layer,
like `app`, never imported by the core or an adapter."""
