#!/usr/bin/env bash
# Build the git-ignored kit that scripts/gpu-h200-vlm.sh carries to the lent GPU machine (H100 or H200) in two calls:
# the SGLang 0.5.17 overlay (57.3 MB) no longer fits one 64 MiB call beside the tracked tree (~10.7 MB), so it is
# split in two.
#   .sgl1/  sglpkgs.tar.xz.00 (28.6 MB) + sgl_h200.sh vlm_device.sh make_random_vlm.py vlmextra.tar.xz
#           + sglpkgs.tar.xz.sha256 (the whole overlay's) + sglpkgs.parts.sha256 (each part's)
#   .sgl2/  sglpkgs.tar.xz.01 (28.6 MB) + the same small files
#   .whl/   the checklist's packages the image lacks (12.6 MB): great_expectations, SQLAlchemy (constraints.txt),
#           altair, marshmallow, mistune, ruamel.yaml, tzlocal, narwhals (required), pytz, arrow, isoduration
#           (imported when present; the 2026-12-05 campaign ran with them)
#   bash scripts/gpu-vlm-kit.sh          build the three folders (pip download needs the package registry)
#   bash scripts/gpu-vlm-kit.sh check    also check the wheels as the machine will use them: a Python 3.12 venv
#        holding only packages of the image (numpy, pandas, scipy, jinja2, ...; not pydantic, orjson, jsonschema),
#        the overlay unpacked on PYTHONPATH (it brings those), the wheels in a --target folder, then
#        `servetune validate` on a kept H200 trial (needs python3.12: PY312, else pyenv's 3.12)
# Device calls (each <= 64 MiB with the tree), the second within the first's 30 s warm window:
#   1. carry [".sgl1"]          `bash scripts/gpu-h200-vlm.sh STEP...` (TEXT_MODEL=1 also writes /tmp/m8b)
#   2. carry [".sgl2", ".whl"]  `NEED_STATE=1 bash scripts/gpu-h200-vlm.sh STEP...`
#   then carry nothing:         `NEED_STATE=1 bash scripts/gpu-h200-vlm.sh STEP...` (a tune resumes)
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
R=${RECIPES:-../shared/recipes}
PIP=${PIP:-python3 -m pip}
WHEELS="altair==6.3.0 marshmallow==4.4.0 mistune==3.4.0 ruamel.yaml==0.19.1 tzlocal==5.4.5 narwhals==2.29.0
        pytz==2026.6 arrow==1.4.0 isoduration==20.11.0"
for x in great-expectations SQLAlchemy; do WHEELS="$WHEELS $(grep -i "^$x==" constraints.txt)"; done

EXCL=$(git rev-parse --git-path info/exclude)
mkdir -p "$(dirname "$EXCL")"
for d in /.sgl/ /.sgl1/ /.sgl2/ /.whl/; do grep -qx "$d" "$EXCL" 2>/dev/null || echo "$d" >> "$EXCL"; done

TAR=$R/sglang-h200/sglpkgs.tar.xz
(cd "$(dirname "$TAR")" && sha256sum -c sglpkgs.tar.xz.sha256)
rm -rf .sgl1 .sgl2 && mkdir -p .sgl1 .sgl2
SIZE=$(stat -c %s "$TAR")
split -b $(( (SIZE + 1) / 2 )) -d -a 2 "$TAR" .sgl1/sglpkgs.tar.xz.
mv .sgl1/sglpkgs.tar.xz.01 .sgl2/
(cd .sgl1 && sha256sum sglpkgs.tar.xz.00; cd ../.sgl2 && sha256sum sglpkgs.tar.xz.01) > /tmp/sglpkgs.parts.sha256
for d in .sgl1 .sgl2; do
  cp "$R"/sglang-h200/sgl_h200.sh "$R"/sglang-h200-vlm/{vlm_device.sh,make_random_vlm.py,vlmextra.tar.xz} "$d"/
  sha256sum "$TAR" | sed 's#  .*#  sglpkgs.tar.xz#' > "$d/sglpkgs.tar.xz.sha256"
  cp /tmp/sglpkgs.parts.sha256 "$d/sglpkgs.parts.sha256"
  chmod -R u+w "$d"
done
[ "$(cat .sgl1/sglpkgs.tar.xz.00 .sgl2/sglpkgs.tar.xz.01 | sha256sum | cut -d' ' -f1)" = "$(cut -d' ' -f1 .sgl1/sglpkgs.tar.xz.sha256)" ]

rm -rf .whl && mkdir -p .whl
# shellcheck disable=SC2086
$PIP download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl $WHEELS

TREE=$(git ls-files -z -co --exclude-standard | du -cb --files0-from=- | tail -1 | cut -f1)
mib() { awk -v b="$1" 'BEGIN { printf "%.1f MiB", b / 1048576 }'; }
S1=$(du -sb .sgl1 | cut -f1); S2=$(du -sb .sgl2 | cut -f1); SW=$(du -sb .whl | cut -f1)
echo ".sgl1 $(mib "$S1"), .sgl2 $(mib "$S2"), .whl $(mib "$SW") ($(ls .whl | wc -l) wheels); tree $(mib "$TREE")"
echo "call 1 (tree + .sgl1): $(mib $(( TREE + S1 ))); call 2 (tree + .sgl2 + .whl): $(mib $(( TREE + S2 + SW ))); limit 64 MiB"
ls .whl

[ "${1:-}" = check ] || exit 0
PY312=${PY312:-$(ls "$HOME"/.pyenv/versions/3.12*/bin/python3.12 2>/dev/null | tail -1)}
PY312=${PY312:-$(command -v python3.12)}
"$PY312" -V || { echo "check needs a Python 3.12 (PY312=...)"; exit 2; }
C=/tmp/gpu-vlm-kit-check; rm -rf "$C"; mkdir -p "$C/ovl"
"$PY312" -m venv "$C/venv"
"$C/venv/bin/pip" install -q numpy pandas scipy jinja2 pyyaml requests typing-extensions packaging attrs tqdm typer \
  rich psutil prometheus-client aiohttp uvloop pillow nvidia-ml-py tokenizers pyparsing six "python-dateutil<3"
# what the image lacks comes from the overlay or the wheels, as on the machine
"$C/venv/bin/pip" uninstall -q -y pydantic pydantic-core annotated-types typing-inspection tzdata 2>/dev/null || true
tar -C "$C/ovl" -xJf "$TAR"
"$C/venv/bin/pip" install -q --no-index --no-deps --no-compile --target "$C/site" .whl/*.whl
export PYTHONPATH="$PWD:$C/ovl:$C/site"
"$C/venv/bin/python" -c "import great_expectations, sqlalchemy; from servetune.validation import checklist; print('imports OK: great_expectations', great_expectations.__version__, 'sqlalchemy', sqlalchemy.__version__)"
"$C/venv/bin/python" -m servetune validate tests/data/gpu-h200-sglang/tune-a/trials/*.json | grep -E "ACCEPTED|REJECTED"
