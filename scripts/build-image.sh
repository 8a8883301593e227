#!/usr/bin/env bash
# Build the container image (Dockerfile) with podman, without pulling a base image.
#
#   scripts/build-image.sh [IMAGE]        # make image; IMAGE defaults to cotenant:<version>
#
# The Dockerfile's stages start FROM ${PYTHON_IMAGE} (python:3.11-slim from a registry). Here
# the base is made instead: debootstrap installs a minimal Debian (python3, python3-venv,
# ca-certificates) from the Debian package mirror, a virtual environment at /opt/python gives
# it the `python` and `pip` the Dockerfile runs, and `podman import` makes it the local image
# localhost/cotenant-python-base (made once, then reused). The Dockerfile is built on it with
# --build-arg PYTHON_IMAGE=…; the wheels come from the Python package index as in any build.
#
# Environment:
#   BASE_IMAGE=python:3.11-slim   build on a registry's image instead (no debootstrap)
#   DEBIAN_MIRROR=URL             the Debian mirror debootstrap reads (default deb.debian.org)
#   REBUILD_BASE=1                make the debootstrap base again
#
# Needs root for debootstrap (chroot, device nodes) and for installing podman/debootstrap
# when they are missing (apt-get). The container runtime and limits are probed
# (scripts/podman-env.sh): crun where it can start a container, else runc.
set -euo pipefail
cd "$(dirname "$0")/.."

version=$(sed -n 's/^version = "\(.*\)"$/\1/p' pyproject.toml)
IMAGE=${1:-cotenant:${version}}
LOCAL_BASE=localhost/cotenant-python-base:3.11-bookworm
SUITE=bookworm
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}

need=()
command -v podman >/dev/null 2>&1 || need+=(podman)
if [ -z "${BASE_IMAGE:-}" ]; then
  command -v debootstrap >/dev/null 2>&1 || need+=(debootstrap)
fi
# runc: the fallback runtime where crun cannot start containers (a cgroup v1/v2 hybrid host)
command -v runc >/dev/null 2>&1 || need+=(runc)
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "build-image: missing ${need[*]}; install them (apt-get install ${need[*]}) and rerun" >&2
    exit 1
  fi
  echo "build-image: installing Debian packages: ${need[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

# shellcheck source=scripts/podman-env.sh
source scripts/podman-env.sh

make_base() {
  if [ "$(id -u)" -ne 0 ]; then
    echo "build-image: debootstrap needs root; rerun as root, or set BASE_IMAGE=python:3.11-slim" \
      "to build on a registry's image" >&2
    exit 1
  fi
  local root
  root=$(mktemp -d /tmp/cotenant-base.XXXXXX)
  trap 'rm -rf "$root"' RETURN
  echo "build-image: debootstrap $SUITE (minbase, python3) from $MIRROR"
  debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates \
    "$SUITE" "$root" "$MIRROR" >"$root.log" 2>&1 || {
    tail -20 "$root.log" >&2
    echo "build-image: debootstrap failed (log above)" >&2
    exit 1
  }
  rm -f "$root.log"
  # `python` and `pip` as python:3.11-slim has them, in a venv Debian's pip policy allows
  chroot "$root" python3 -m venv /opt/python
  # what an image never reads: package caches and lists, documentation, manuals, locales
  rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/* \
    "$root"/usr/share/doc/* "$root"/usr/share/man/* "$root"/usr/share/info/* \
    "$root"/usr/share/locale/* "$root"/var/log/*.log "$root"/var/cache/debconf/*-old
  tar --numeric-owner -C "$root" -c . | podman import \
    --change 'ENV PATH=/opt/python/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'ENV LANG=C.UTF-8' \
    --change 'CMD ["python3"]' \
    - "$LOCAL_BASE" >/dev/null
  echo "build-image: made $LOCAL_BASE"
}

if [ -n "${BASE_IMAGE:-}" ]; then
  base=$BASE_IMAGE
else
  base=$LOCAL_BASE
  if [ -n "${REBUILD_BASE:-}" ] || ! podman image exists "$base"; then
    make_base
  fi
fi

# The build's pip and npm fetches trust what this host trusts (a proxy's CA, where there is
# one): the host's CA bundle is mounted over the build containers' for the RUN steps only,
# and a pip.conf points pip at it; neither stays in a layer.
mounts=()
host_ca=/etc/ssl/certs/ca-certificates.crt
if [ -r "$host_ca" ]; then
  conf=$(mktemp /tmp/cotenant-pip.XXXXXX.conf)
  trap 'rm -f "$conf"' EXIT
  printf '[global]\ncert = %s\n' "$host_ca" >"$conf"
  mounts+=(-v "$host_ca:$host_ca:ro" -v "$conf:/etc/pip.conf:ro")
fi

podman_probe "$base"
echo "build-image: ${PODMAN[*]} build -t $IMAGE (base $base)"
# --no-cache: podman 4 / buildah 1.28 key a RUN's layer on its text, not on the content of the
# stage it bind-mounts (the runtime's install would be reused over new wheels), and cannot
# bind-mount a stage taken from the cache (the install then finds no /wheels). Every build
# starts afresh: a minute or two, the dependencies' wheels downloaded again.
"${PODMAN[@]}" build --no-cache "${PODMAN_LIMITS[@]}" "${mounts[@]}" \
  --build-arg "PYTHON_IMAGE=$base" -t "$IMAGE" .
podman image inspect --format '{{.Size}}' "$IMAGE" |
  awk -v img="$IMAGE" '{printf "build-image: built %s, %.0f MB\n", img, $1 / 1e6}'
