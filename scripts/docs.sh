#!/usr/bin/env bash
# The documentation build and its checks (docs/README.md):
# - rustdoc of the library crate into target/doc, with warnings as errors, so a broken
#   intra-doc link or a doc comment rustdoc cannot read fails here rather than on docs.rs;
# - docs/python-api.md up to date with the docstrings of python/symheap/ (the page is
#   generated, so a docstring change without a regenerated page fails here).
# Needs Rust and a python3 (nothing is imported: the page is generated with `ast`).
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=lib/steps.sh
source scripts/lib/steps.sh

# The user's own RUSTDOCFLAGS stay; -D warnings comes last so nothing turns it off.
step "rustdoc -p symheap (-D warnings) into target/doc" \
  env RUSTDOCFLAGS="${RUSTDOCFLAGS:-} -D warnings" cargo doc --no-deps --locked -p symheap
step "docs/python-api.md up to date (scripts/gen_python_api.py --check)" \
  python3 scripts/gen_python_api.py --check
echo "docs: target/doc/symheap/index.html and docs/*.md" >&2
