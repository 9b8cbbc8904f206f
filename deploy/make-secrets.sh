#!/bin/sh
# Development secrets for deploy/docker-compose.yml (and the Kubernetes Secrets of deploy/README.md):
# a private CA, server certificates for Kafka and Redis, one password per role, the broker's JAAS
# file and admin client properties, and the Redis ACL file (passwords hashed, pipeline.acl).
#   sh deploy/make-secrets.sh [DIR]        # default deploy/secrets (git-ignored); never commit it
# Production: use your own CA and a secret manager; the file names below are what the deploy files mount.
set -eu
REPO="$(cd "$(dirname "$0")/.." && pwd)"
DIR="${1:-$REPO/deploy/secrets}"
CONFIG="$(cd "$(dirname "${DPSTREAM_CONFIG:-$REPO/deploy/config/dpstream.yaml}")" && pwd)/$(basename "${DPSTREAM_CONFIG:-dpstream.yaml}")"
PYTHON="${PYTHON:-python3}"
mkdir -p "$DIR"
chmod 0700 "$DIR"  # the directory keeps other users of this host out
# Files 0644: compose bind-mounts each one into containers whose users (kafka uid 1000, redis 999,
# dpstream 10001) are not the host user who owns them; outside the containers the 0700 directory protects them.
umask 022
cd "$DIR"

password() { "$PYTHON" -c 'import secrets; print(secrets.token_urlsafe(24))'; }

openssl req -x509 -newkey rsa:3072 -nodes -keyout ca.key -out ca.crt -days 825 -subj "/CN=dpstream CA" 2>/dev/null
for server in kafka redis; do
  printf 'subjectAltName=DNS:%s,DNS:%s-0.%s.dpstream.svc.cluster.local,DNS:%s.dpstream.svc.cluster.local,DNS:localhost\n' \
    "$server" "$server" "$server" "$server" > "$server.ext"
  openssl req -newkey rsa:3072 -nodes -keyout "$server.key" -out "$server.csr" -subj "/CN=$server" 2>/dev/null
  openssl x509 -req -in "$server.csr" -CA ca.crt -CAkey ca.key -CAcreateserial -out "$server.crt" -days 825 \
    -extfile "$server.ext" 2>/dev/null
  rm -f "$server.csr" "$server.ext"
done

# Kafka: PKCS#12 keystore and its password (KAFKA_SSL_KEYSTORE_* of the apache/kafka image)
password > keystore-password
openssl pkcs12 -export -in kafka.crt -inkey kafka.key -certfile ca.crt -name kafka \
  -out kafka.keystore.p12 -passout "file:keystore-password"
password > kafka-admin-password
ADMIN="$(cat kafka-admin-password)"
cat > kafka_server_jaas.conf <<EOF
KafkaServer {
  org.apache.kafka.common.security.plain.PlainLoginModule required
    username="admin" password="$ADMIN" user_admin="$ADMIN";
  org.apache.kafka.common.security.scram.ScramLoginModule required;
};
EOF
cat > admin.properties <<EOF
security.protocol=SASL_SSL
sasl.mechanism=PLAIN
sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required username="admin" password="$ADMIN";
ssl.truststore.type=PEM
ssl.truststore.location=/run/secrets/dpstream-ca/ca.crt
EOF

# One Kafka password per role (SCRAM users created by deploy/kafka-acls.sh) and one Redis password per
# stream role (ACL users of users.acl; analysts and producers have no Redis user).
for role in worker releaser operator producer analyst admin; do password > "kafka-$role"; done
for role in worker releaser operator; do password > "redis-$role"; done
password > grafana-admin  # Grafana's admin login (GF_SECURITY_ADMIN_PASSWORD__FILE), never its default
DPSTREAM_REDIS_PASSWORD_WORKER="$(cat redis-worker)" DPSTREAM_REDIS_PASSWORD_RELEASER="$(cat redis-releaser)" \
DPSTREAM_REDIS_PASSWORD_OPERATOR="$(cat redis-operator)" \
PYTHONPATH="$REPO" "$PYTHON" -m pipeline.acl --config "$CONFIG" redis > users.acl
# The control plane's Ed25519 pairs (docs/security.md, "The control plane"): the curator's signs close
# commands and stays on the curator's machine (mounted in no container); the deadline pair's private
# half goes to the releaser only (0644 like the passwords above, for the container's user); the
# curator's private key 0600.
for pair in curator deadline; do
  openssl genpkey -algorithm ed25519 -out "control-$pair.key"
  openssl pkey -in "control-$pair.key" -pubout -out "control-$pair.pub"
done
chmod 0600 control-curator.key
echo "secrets written to $DIR (directory mode 0700)"
