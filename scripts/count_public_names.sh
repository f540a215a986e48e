#!/usr/bin/env bash
# Counts the names a user of the installed headers can reach: classes, enums and their values,
# functions, members and constants declared in include/spill/*.h (or the headers in DIR), outside
# spill::detail and outside private/protected sections. Overloads count once. The CHANGELOG
# states this count before and after a change to the public surface.
#
#   scripts/count_public_names.sh            # include/spill
#   scripts/count_public_names.sh DIR -v     # another header directory; -v lists the names
#   scripts/count_public_names.sh --python   # spillarena.__all__ instead (-v lists them), read
#                                            # from python/spillarena/__init__.py, nothing built
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ ${1:-} == --python ]]; then
  python3 - python/spillarena/__init__.py "${2:-}" <<'PY'
import ast
import sys

tree = ast.parse(open(sys.argv[1]).read())
names = next(ast.literal_eval(node.value) for node in tree.body if isinstance(node, ast.Assign)
             and any(getattr(t, "id", None) == "__all__" for t in node.targets))
if sys.argv[2] == "-v":
    print("\n".join(sorted(names)))
print(len(names))
PY
  exit
fi
dir=${1:-include/spill}
command -v ctags >/dev/null || { echo "count_public_names: needs universal-ctags" >&2; exit 2; }
names=$(ctags -x --_xformat='%{scope} %N %{access}' --language-force=C++ --kinds-C++=+p-l \
    --fields=+aZ -o - "$dir"/*.h |
  awk '$NF != "private" && $NF != "protected" && $1 !~ /detail/ {
         scope = ($1 == "-" ? "" : $1 "::"); print scope $2 }' |
  sort -u)
[[ ${2:-} == -v ]] && echo "$names"
echo "$names" | grep -c . 
