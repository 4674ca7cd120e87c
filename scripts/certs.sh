#!/usr/bin/env bash
# Makes the certificates for a local TLS cluster (docs/security.md), with openssl:
#
#   scripts/certs.sh DIR [--nodes 3] [--client NAME]
#
#   DIR/ca.crt, ca.key                the cluster (peer) CA: signs the nodes' certificates
#   DIR/node-N.crt, node-N.key        node N: SANs localhost, node-N, 127.0.0.1; serves the
#                                     client port and is its peer identity
#   DIR/client-ca.crt, client-ca.key  the client CA (kept apart from the cluster CA, so a
#                                     client certificate can never pass for a peer)
#   DIR/client.crt, client.key        a client certificate, CN and DNS name NAME (default
#                                     timerctl): mTLS, and a certificate user (key --cert-name)
#
# Existing files are kept (delete DIR to start again). For tests and demos: production CAs
# live in a real PKI.
set -euo pipefail

DIR=${1:?usage: scripts/certs.sh DIR [--nodes N] [--client NAME]}
shift
NODES=3
CLIENT=timerctl
while [[ $# -gt 0 ]]; do
  case "$1" in
    --nodes) NODES=$2; shift 2 ;;
    --client) CLIENT=$2; shift 2 ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done

if ! command -v openssl >/dev/null; then
  echo "== installing openssl" >&2
  if command -v apt-get >/dev/null; then
    apt-get install -y -q openssl >/dev/null || { apt-get update -q && apt-get install -y -q openssl; }
  elif command -v dnf >/dev/null; then
    dnf install -y -q openssl
  else
    echo "openssl is missing and no package manager is known here" >&2; exit 1
  fi
fi

mkdir -p "$DIR"
cd "$DIR"
umask 077

key() { openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1" 2>/dev/null; }

ca() { # name, common name
  [[ -f $1.crt ]] && return
  key "$1.key"
  openssl req -x509 -new -key "$1.key" -out "$1.crt" -days 3650 -subj "/CN=$2" \
    -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign"
  echo "made $DIR/$1.crt"
}

leaf() { # name, CA, common name, SANs, extended key usage
  [[ -f $1.crt ]] && return
  key "$1.key"
  openssl req -new -key "$1.key" -out "$1.csr" -subj "/CN=$3"
  printf 'subjectAltName=%s\nextendedKeyUsage=%s\nkeyUsage=critical,digitalSignature\nbasicConstraints=CA:FALSE\n' \
    "$4" "$5" >"$1.ext"
  openssl x509 -req -in "$1.csr" -CA "$2.crt" -CAkey "$2.key" -CAcreateserial -out "$1.crt" \
    -days 825 -extfile "$1.ext" 2>/dev/null
  rm -f "$1.csr" "$1.ext"
  echo "made $DIR/$1.crt"
}

ca ca "timerdb cluster CA"
ca client-ca "timerdb client CA"
for n in $(seq 1 "$NODES"); do
  leaf "node-$n" ca "node-$n" "DNS:localhost,DNS:node-$n,IP:127.0.0.1" "serverAuth,clientAuth"
done
leaf client client-ca "$CLIENT" "DNS:$CLIENT" "clientAuth"
chmod 644 ./*.crt
