"""Generated from ci/pins.toml [sglang] by ci/readme_tables.py; do not edit (CI checks it)."""

SUPPORTED = '>=0.5.17,<=0.5.23'
TESTED = ('0.5.23',)
RELEASES = ('0.5.17', '0.5.18', '0.5.19', '0.5.20', '0.5.21', '0.5.22', '0.5.23')
