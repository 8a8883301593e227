#!/usr/bin/env bash
# Install the Debian packages the test suite needs, only when they are missing:
#   prometheus        -> promtool and the Prometheus server (rules tests, e2e alerting)
#   prometheus-alertmanager -> Alertmanager routing alerts to cotenant's webhook (e2e)
#   chromium, chromium-driver -> headless browser tests of the dashboard and report
#   nginx             -> the reference proxy the gateway benchmark compares against
#   haproxy           -> the load balancer the HAProxy actuator backend drives (its tests start one)
#   victoria-metrics  -> the second PromQL engine the fleet tests read through (tests/e2e)
#   openssl           -> the self-signed certificate of the TLS test (tests/test_tls.py)
#   kubernetes-client -> kubectl, whose kustomize builds deploy/k8s in tests/test_deploy.py
set -euo pipefail

need=()
command -v promtool >/dev/null 2>&1 || need+=(prometheus)
command -v chromium >/dev/null 2>&1 || need+=(chromium)
command -v chromedriver >/dev/null 2>&1 || need+=(chromium-driver)
command -v prometheus-alertmanager >/dev/null 2>&1 || need+=(prometheus-alertmanager)
command -v nginx >/dev/null 2>&1 || [ -x /usr/sbin/nginx ] || need+=(nginx)
command -v haproxy >/dev/null 2>&1 || [ -x /usr/sbin/haproxy ] || need+=(haproxy)
command -v victoria-metrics >/dev/null 2>&1 || need+=(victoria-metrics)
command -v openssl >/dev/null 2>&1 || need+=(openssl)
command -v kubectl >/dev/null 2>&1 || need+=(kubernetes-client)

if [ ${#need[@]} -eq 0 ]; then
  exit 0
fi

echo "installing Debian packages: ${need[*]} (needed by the tests)"
if [ "$(id -u)" -eq 0 ]; then
  SUDO=""
elif command -v sudo >/dev/null 2>&1; then
  SUDO="sudo"
else
  echo "error: need root or sudo to apt-get install ${need[*]}; install them, then rerun" >&2
  exit 1
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
echo "installed: ${need[*]}"
