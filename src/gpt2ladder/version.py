"""The package's version, in one place: the bottom layer, so any module may import it without importing the
package root (whose lazy API lookups reach up to `api`). pyproject.toml reads it from here."""

__version__ = "0.1.0"
