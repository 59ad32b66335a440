"""One module per ``blendserve`` subcommand; each defines ``add_parser(subparsers)``."""
