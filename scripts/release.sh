#!/usr/bin/env bash
# The release path, one script for `make image`, the release workflow (.github/workflows/release.yml)
# and the test that publishes the chart to a local stand-in of ghcr.io
# (tests/cluster/test_documented_helm_lines.py). Names come from the chart, never re-typed:
#   image      charts/praesto/values.yaml image.repository : Chart.yaml appVersion
#   chart      oci://<registry>/<owner>/charts/praesto : Chart.yaml version, where <registry>/<owner>
#              is the image repository's (ghcr.io/praesto/praesto -> oci://ghcr.io/praesto/charts)
# Usage:
#   release.sh names          prints version=, app_version=, image=, chart_repository= (GITHUB_OUTPUT lines)
#   release.sh check TAG      TAG (v-prefix optional) must equal Chart.yaml version and appVersion
#   release.sh image          builds the Dockerfile as <image>:<appVersion> (IMAGE_TAG overrides the tag)
#                             with docker, podman or buildah, the first found (IMAGE_BUILDER picks one)
#   release.sh chart [push]   helm dependency build, helm package into dist/, and with `push`
#                             helm push to the chart repository (helm must be logged in to push)
# Exit: 2 usage, 1 a lasting problem (versions disagree, no builder), else the tool's own status.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
chart=charts/praesto
me="release.sh"

top_level() {  # a top-level scalar of Chart.yaml, unquoted
  awk -v key="$1:" '$1 == key && /^[^ #]/ { gsub(/["'\'']/, "", $2); print $2; exit }' "$chart/Chart.yaml"
}

image_repository() {  # values.yaml image.repository: the `repository:` inside the top-level `image:` block
  awk '/^image:/ { inside = 1; next } inside && /^[^ #]/ { exit }
       inside && $1 == "repository:" { gsub(/["'\'']/, "", $2); print $2; exit }' "$chart/values.yaml"
}

version="$(top_level version)"
app_version="$(top_level appVersion)"
image="$(image_repository)"
if [ -z "$version" ] || [ -z "$app_version" ] || [ -z "$image" ]; then
  echo "$me: cannot read version/appVersion from $chart/Chart.yaml or image.repository from $chart/values.yaml" >&2
  exit 1
fi
chart_repository="oci://${image%/*}/charts"

case "${1:-}" in
  names)
    printf 'version=%s\napp_version=%s\nimage=%s\nchart_repository=%s\n' \
      "$version" "$app_version" "$image" "$chart_repository"
    ;;
  check)
    if [ -z "${2:-}" ]; then
      echo "$me check: give the release tag, e.g. \`$me check v$version\`" >&2
      exit 2
    fi
    tag="${2#v}"
    if [ "$tag" != "$version" ] || [ "$tag" != "$app_version" ]; then
      echo "$me: tag $2 does not match $chart/Chart.yaml (version $version, appVersion $app_version):" \
        "set both to $tag and tag again, or tag v$version" >&2
      exit 1
    fi
    echo "$me: tag $2 = Chart.yaml version = appVersion"
    ;;
  image)
    builder="${IMAGE_BUILDER:-}"
    if [ -n "$builder" ]; then
      case "$builder" in
        docker | podman | buildah) ;;
        *)
          echo "$me image: IMAGE_BUILDER=$builder is not one of docker, podman, buildah" >&2
          exit 2
          ;;
      esac
      if ! command -v "$builder" >/dev/null 2>&1; then
        echo "$me image: IMAGE_BUILDER=$builder is not on PATH: install it or unset IMAGE_BUILDER" >&2
        exit 1
      fi
    else
      # docker is a client: it builds only when its daemon answers; podman and buildah need none.
      found=""
      for candidate in docker podman buildah; do
        command -v "$candidate" >/dev/null 2>&1 || continue
        if [ "$candidate" = docker ] && ! docker info >/dev/null 2>&1; then
          found="docker (its daemon does not answer: start it)"
          continue
        fi
        builder="$candidate"
        break
      done
      if [ -z "$builder" ]; then
        echo "$me image: no image builder to use: ${found:-none of docker, podman, buildah is installed};" \
          "install podman or buildah, or start docker (the release workflow builds the published image)" >&2
        exit 1
      fi
    fi
    reference="$image:${IMAGE_TAG:-$app_version}"
    echo "$me image: building $reference with $builder" >&2
    case "$builder" in
      buildah) exec buildah build --file Dockerfile --tag "$reference" . ;;
      *) exec "$builder" build --file Dockerfile --tag "$reference" . ;;
    esac
    ;;
  chart)
    if [ -n "${2:-}" ] && [ "$2" != push ]; then
      echo "$me chart: the only option is \`push\` (got $2)" >&2
      exit 2
    fi
    helm dependency build "$chart"
    mkdir -p dist
    helm package "$chart" --destination dist
    if [ "${2:-}" = push ]; then
      helm push "dist/praesto-$version.tgz" "$chart_repository"
    fi
    ;;
  *)
    echo "usage: $me names | check TAG | image | chart [push]" >&2
    exit 2
    ;;
esac
