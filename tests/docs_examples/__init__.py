"""Views, URLconfs and functions that the docs' examples run (docs/**/*.md): each page
shows its module with `literalinclude` and drives it from its examples."""
