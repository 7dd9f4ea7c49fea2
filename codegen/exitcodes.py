"""The commands' exit codes (``codegen/cli.py``'s EPILOG says what each means), in a module of
their own so that every command (``cli`` and ``tune/cli``) imports them without importing the
other."""

EXIT_OK, EXIT_STALE, EXIT_INVALID, EXIT_INTERNAL = 0, 1, 2, 3
EXIT_IO = EXIT_INVALID  # generated/ (or a spec file) cannot be read or written
