#!/usr/bin/env bash
# Uploads the wheels of this build (main branch, after the block step).
#
# Environment (agent secrets):
#   VFA_PUBLISH_REPOSITORY_URL   the upload endpoint of the index
#   TWINE_USERNAME, TWINE_PASSWORD
#   VFA_PUBLISH_LOCAL=1 (default)  the index takes local versions (+fa<commit>.cu<N>):
#                                  every CUDA major is uploaded.
#   VFA_PUBLISH_LOCAL=0            the index refuses local versions: the build must
#                                  have run with VFA_VERSION_LOCAL=0, and only
#                                  VFA_PUBLISH_CUDA (default 13.0) is uploaded.
source "$(dirname "$0")/common.sh"
cd "$ROOT"
: "${VFA_PUBLISH_REPOSITORY_URL:?set VFA_PUBLISH_REPOSITORY_URL (docs/release.md)}"
rm -rf wheelhouse && mkdir -p wheelhouse
buildkite-agent artifact download "wheelhouse/*/*.whl" .
if [ "${VFA_PUBLISH_LOCAL:-1}" = 0 ]; then
  files=(wheelhouse/cu"${VFA_PUBLISH_CUDA:-13.0}"-*/*.whl)
  for f in "${files[@]}"; do
    case "$(basename "$f")" in
      *+*) echo "$f has a local version label; rebuild with VFA_VERSION_LOCAL=0 for this index" >&2; exit 1 ;;
    esac
  done
else
  files=(wheelhouse/*/*.whl)
fi
echo "--- wheels to upload (sha256: a rebuild of this commit gives the same)"
sha256sum "${files[@]}"
tools_venv .venv-publish twine
.venv-publish/bin/twine check --strict "${files[@]}"
.venv-publish/bin/twine upload --non-interactive --repository-url "$VFA_PUBLISH_REPOSITORY_URL" "${files[@]}"
