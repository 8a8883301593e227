# shellcheck shell=bash
# Sourced by scripts/build-image.sh and scripts/image-test.sh: how podman can run a container
# on this host. `podman_probe IMAGE` sets
#   PODMAN         the podman command with its runtime (crun where it starts a container, else
#                  runc: crun refuses a host whose cgroups are a v1/v2 hybrid)
#   PODMAN_LIMITS  --ulimit flags within this process's hard limits (podman's defaults ask for
#                  more open files and processes than a container host without
#                  CAP_SYS_RESOURCE may grant)
# and fails with what it saw when no runtime can start IMAGE.

podman_probe() {
  local image=$1 nofile nproc rt out=""
  nofile=$(ulimit -Hn)
  nproc=$(ulimit -Hu)
  [ "$nofile" = unlimited ] || [ "$nofile" -gt 65536 ] && nofile=65536
  [ "$nproc" = unlimited ] || [ "$nproc" -gt 32768 ] && nproc=32768
  PODMAN_LIMITS=(--ulimit "nofile=$nofile:$nofile" --ulimit "nproc=$nproc:$nproc")
  for rt in crun runc; do
    command -v "$rt" >/dev/null 2>&1 || continue
    if out=$(podman --runtime "$rt" run --rm "${PODMAN_LIMITS[@]}" --entrypoint true "$image" 2>&1); then
      PODMAN=(podman --runtime "$rt")
      return 0
    fi
  done
  echo "podman cannot start a container here: $out" >&2
  return 1
}
