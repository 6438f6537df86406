{{/*
Names. The full name is cut to 45 characters so that "<fullname>-writer" stays within the
52 characters a StatefulSet name may have (its pods carry a controller-revision-hash label),
and the claim "data-<fullname>-writer-0" within 63.
*/}}
{{- define "rmqstore.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 45 | trimSuffix "-" }}
{{- end }}

{{- define "rmqstore.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 45 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 45 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 45 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "rmqstore.writerName" -}}
{{- printf "%s-writer" (include "rmqstore.fullname" .) }}
{{- end }}

{{/* One etcd serves the elections of every writer group of the release (each group its own election name). */}}
{{- define "rmqstore.etcdName" -}}
{{- printf "%s-etcd" (include "rmqstore.releaseFullname" .) }}
{{- end }}

{{/* The release's full name, also from a group's context (whose fullname has the group in it). */}}
{{- define "rmqstore.releaseFullname" -}}
{{- get . "releaseFullname" | default (include "rmqstore.fullname" .) }}
{{- end }}

{{/*
The writer groups of a cluster (values: groups), each rendered from a context of its own:
the release's, with the values a group changes. Call with
(dict "root" $ "index" K "group" NAME "into" (dict)); fills "into". An empty NAME is today's
single group: the release's context unchanged, so its objects keep their names. A group's
objects are named <fullname>-<group>-writer, -query, data-<fullname>-<group>-writer-0; its
writers run with --broker-name <group>, their own --store-host and election name.
*/}}
{{- define "rmqstore.groupContext" -}}
{{- $root := .root }}
{{- range $key, $item := $root }}
{{- $_ := set $.into $key $item }}
{{- end }}
{{- $_ := set .into "group" .group }}
{{- if .group }}
{{- $fullname := include "rmqstore.fullname" $root }}
{{- $groupFullname := printf "%s-%s" $fullname .group }}
{{- if gt (len $groupFullname) 45 }}
{{- fail (printf "group %s: %s is %d characters; the release's full name and a group's name together may have 45 (a StatefulSet's name limit less -writer): shorten the group's name, the release's, or fullnameOverride" .group $groupFullname (len $groupFullname)) }}
{{- end }}
{{- $values := deepCopy $root.Values }}
{{- $_ := set $values "fullnameOverride" $groupFullname }}
{{- $_ := set $values.writer "brokerName" .group }}
{{- if not $values.store.storeHost }}
{{- $_ := set $values.store "storeHost" (printf "127.0.0.%d:%d" (add .index 1) (int64 $values.writer.port)) }}
{{- end }}
{{- $_ := set $values.writer.group "name" (printf "%s-%s" ($values.writer.group.name | default $fullname) .group) }}
{{- $_ := set .into "Values" $values }}
{{- $_ := set .into "releaseFullname" $fullname }}
{{- end }}
{{- end }}

{{/* The group names to render: values.groups, or one unnamed group (today's single writer). */}}
{{- define "rmqstore.groupNames" -}}
{{- toJson (.Values.groups | default (list "")) }}
{{- end }}

{{- define "rmqstore.proxyName" -}}
{{- printf "%s-proxy" (include "rmqstore.fullname" .) }}
{{- end }}

{{/* A writer group's etcd members, HOST:PORT,…: writer.group.etcd or the chart's own. */}}
{{- define "rmqstore.etcdEndpoints" -}}
{{- if .Values.writer.group.etcd }}
{{- join "," .Values.writer.group.etcd }}
{{- else }}
{{- $name := include "rmqstore.etcdName" . }}
{{- $members := list }}
{{- range $k := until (int .Values.etcd.replicas) }}
{{- $members = append $members (printf "%s-%d.%s.%s.svc:%d" $name $k $name $.Release.Namespace (int64 $.Values.etcd.clientPort)) }}
{{- end }}
{{- join "," $members }}
{{- end }}
{{- end }}

{{/* A writer group's replicas, K=HOST:PORT,…: pod K by its stable name under the headless Service. */}}
{{- define "rmqstore.groupReplicas" -}}
{{- $name := include "rmqstore.writerName" . }}
{{- $replicas := list }}
{{- range $k := until (int .Values.writer.replicas) }}
{{- $replicas = append $replicas (printf "%d=%s-%d.%s.%s.svc:%d" $k $name $k $name $.Release.Namespace (int64 $.Values.writer.port)) }}
{{- end }}
{{- join "," $replicas }}
{{- end }}

{{- define "rmqstore.queryName" -}}
{{- printf "%s-query" (include "rmqstore.fullname" .) }}
{{- end }}

{{/* The writer's claim, as the StatefulSet names it: <template>-<statefulset>-<ordinal>. */}}
{{- define "rmqstore.claimName" -}}
{{- printf "data-%s-0" (include "rmqstore.writerName" .) }}
{{- end }}

{{- define "rmqstore.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "rmqstore.releaseFullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "rmqstore.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Selector labels: stable for the life of a release (selectors are immutable). */}}
{{/* A group's objects carry its broker name too, so that groups' selectors do not overlap. */}}
{{- define "rmqstore.selectorLabels" -}}
app.kubernetes.io/name: {{ include "rmqstore.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
{{- with .component }}
app.kubernetes.io/component: {{ . }}
{{- end }}
{{- with get .root "group" }}
rmqstore/broker-name: {{ . }}
{{- end }}
{{- end }}

{{/* Labels on every object; call with (dict "root" $ "component" "writer"|"query"|""). */}}
{{- define "rmqstore.labels" -}}
helm.sh/chart: {{ include "rmqstore.chart" .root }}
{{ include "rmqstore.selectorLabels" . }}
app.kubernetes.io/part-of: rmqstore
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
{{- end }}

{{- define "rmqstore.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
{{- end }}

{{- define "rmqstore.storePath" -}}
{{- printf "%s/store" (trimSuffix "/" .Values.persistence.mountPath) }}
{{- end }}

{{- define "rmqstore.accessMode" -}}
{{- if .Values.persistence.accessMode }}
{{- .Values.persistence.accessMode }}
{{- else if eq .Values.mode "shared" }}
{{- "ReadWriteMany" }}
{{- else }}
{{- "ReadWriteOnce" }}
{{- end }}
{{- end }}

{{/*
The store's size flags, shared by writer and query nodes so that they cannot disagree.
Numbers go through int64: Helm holds values as float64, and 1073741824 would otherwise
render as 1.073741824e+09.
*/}}
{{- define "rmqstore.sizeArgs" -}}
{{- with .Values.store.sizes }}
- --commitlog-file-size
- {{ int64 .commitlogFileSizeBytes | quote }}
- --cq-file-units
- {{ int64 .cqFileUnits | quote }}
- --index-slots
- {{ int64 .indexSlots | quote }}
- --index-entries
- {{ int64 .indexEntries | quote }}
{{- end }}
{{- end }}

{{/*
TLS flags of a server, and its plaintext health port, when tls.enabled; call with
(dict "root" $ "healthPort" P). The files are the keys of the kubernetes.io/tls Secret.
*/}}
{{- define "rmqstore.tlsArgs" -}}
{{- $tls := .root.Values.tls }}
{{- if $tls.enabled }}
{{- $dir := trimSuffix "/" $tls.mountPath }}
- --tls-cert
- {{ printf "%s/tls.crt" $dir | quote }}
- --tls-key
- {{ printf "%s/tls.key" $dir | quote }}
{{- if $tls.clientAuth }}
- --tls-client-ca
- {{ printf "%s/ca.crt" $dir | quote }}
{{- end }}
- --health-port
- {{ int64 .healthPort | quote }}
{{- end }}
{{- end }}

{{/* Access flags of a server: the ACL file from its Secret, or the explicit open door. */}}
{{- define "rmqstore.accessArgs" -}}
{{- if .Values.acl.secretName }}
- --acl
- {{ printf "%s/acl.yaml" (trimSuffix "/" .Values.acl.mountPath) | quote }}
{{- else if .Values.insecureOpen }}
- --insecure-open
{{- end }}
{{- end }}

{{/* The port the probes ask: the plaintext health port with TLS, the gRPC port without. */}}
{{- define "rmqstore.probePort" -}}
{{- if .root.Values.tls.enabled }}{{ int64 .component.healthPort }}{{ else }}{{ int64 .component.port }}{{ end }}
{{- end }}

{{- define "rmqstore.writerArgs" -}}
- writer
- serve
- --store
- {{ include "rmqstore.storePath" . | quote }}
- --host
- "0.0.0.0"
- --port
- {{ int64 .Values.writer.port | quote }}
- --flush
- {{ .Values.store.flush | quote }}
- --flush-interval-ms
- {{ int64 .Values.store.flushIntervalMs | quote }}
- --retention-hours
- {{ .Values.store.retentionHours | toString | quote }}
- --disk-clean-ratio
- {{ .Values.store.diskCleanRatio | toString | quote }}
- --disk-full-ratio
- {{ .Values.store.diskFullRatio | toString | quote }}
{{- if not .Values.store.autoCreateTopics }}
- --no-auto-create
{{- end }}
- --max-topics
- {{ int64 .Values.store.maxTopics | quote }}
- --max-queues
- {{ int64 .Values.store.maxQueues | quote }}
- --max-groups
- {{ int64 .Values.store.maxGroups | quote }}
- --large-answer-rate
- {{ int64 .Values.store.largeAnswerRate | quote }}
{{- if .Values.store.storeHost }}
- --store-host
- {{ .Values.store.storeHost | quote }}
{{- end }}
- --advertise
- {{ .Values.writer.advertise | default (printf "%s.%s.svc:%d" (include "rmqstore.writerName" .) .Release.Namespace (int64 .Values.writer.port)) | quote }}
- --broker-name
- {{ .Values.writer.brokerName | quote }}
{{- if .Values.metrics.prometheus.enabled }}
- --metrics-port
- {{ int64 .Values.writer.metricsPort | quote }}
{{- end }}
{{- if gt (int .Values.writer.replicas) 1 }}
- --group
- {{ .Values.writer.group.name | default (include "rmqstore.fullname" .) | quote }}
- --replica-id
- "$(RMQSTORE_REPLICA_ID)"
- --replicas
- {{ include "rmqstore.groupReplicas" . | quote }}
- --replication
- {{ .Values.writer.group.replication | quote }}
- --min-insync
- {{ int64 .Values.writer.group.minInsync | quote }}
- --replica-lag-max-ms
- {{ int64 .Values.writer.group.replicaLagMaxMs | quote }}
- --replica-pace-ms
- {{ int64 .Values.writer.group.replicaPaceMs | quote }}
- --etcd
- {{ include "rmqstore.etcdEndpoints" . | quote }}
- --lease-ttl-s
- {{ int64 .Values.writer.group.leaseTtlS | quote }}
{{- if .Values.tls.enabled }}
{{- $dir := trimSuffix "/" .Values.tls.mountPath }}
- --replica-tls-ca
- {{ printf "%s/ca.crt" $dir | quote }}
{{- if .Values.tls.clientAuth }}
- --replica-tls-cert
- {{ printf "%s/tls.crt" $dir | quote }}
- --replica-tls-key
- {{ printf "%s/tls.key" $dir | quote }}
{{- end }}
{{- end }}
{{- end }}
{{- include "rmqstore.tlsArgs" (dict "root" . "healthPort" .Values.writer.healthPort) }}
{{- include "rmqstore.accessArgs" . }}
{{- include "rmqstore.sizeArgs" . }}
{{- end }}

{{- define "rmqstore.queryArgs" -}}
- query
- serve
- --store
- {{ include "rmqstore.storePath" . | quote }}
- --host
- "0.0.0.0"
- --port
- {{ int64 .Values.query.port | quote }}
{{- if .Values.metrics.prometheus.enabled }}
- --metrics-port
- {{ int64 .Values.query.metricsPort | quote }}
{{- end }}
- --broker-name
- {{ .Values.writer.brokerName | quote }}
{{- include "rmqstore.tlsArgs" (dict "root" . "healthPort" .Values.query.healthPort) }}
{{- include "rmqstore.accessArgs" . }}
{{- include "rmqstore.sizeArgs" . }}
{{- end }}

{{/* Environment of an rmqstore container; call with (dict "root" $ "component" "writer"|"query"). */}}
{{- define "rmqstore.env" -}}
{{- $otel := .root.Values.otel -}}
- name: POD_NAME
  valueFrom:
    fieldRef:
      fieldPath: metadata.name
- name: POD_NAMESPACE
  valueFrom:
    fieldRef:
      fieldPath: metadata.namespace
{{- if $otel.enabled }}
- name: OTEL_TRACES_EXPORTER
  value: {{ $otel.tracesExporter | quote }}
{{- if $otel.endpoint }}
- name: OTEL_EXPORTER_OTLP_ENDPOINT
  value: {{ $otel.endpoint | quote }}
{{- end }}
- name: OTEL_SERVICE_NAME
  value: {{ index $otel.serviceName .component | quote }}
- name: OTEL_TRACES_SAMPLER
  value: {{ $otel.sampler | quote }}
{{- if $otel.samplerArg }}
- name: OTEL_TRACES_SAMPLER_ARG
  value: {{ $otel.samplerArg | toString | quote }}
{{- end }}
{{- $attributes := list "k8s.pod.name=$(POD_NAME)" "k8s.namespace.name=$(POD_NAMESPACE)" (printf "k8s.container.name=%s" .component) }}
{{- range $key, $value := $otel.resourceAttributes }}
{{- $attributes = append $attributes (printf "%s=%s" $key (toString $value)) }}
{{- end }}
- name: OTEL_RESOURCE_ATTRIBUTES
  value: {{ join "," $attributes | quote }}
{{- end }}
{{- if .root.Values.metrics.prometheus.enabled }}
- name: OTEL_METRICS_EXPORTER
  value: "prometheus"
{{- end }}
{{- with (index .root.Values .component).extraEnv }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* A native gRPC probe; call with (dict "port" P "service" S "settings" probeValues). */}}
{{- define "rmqstore.grpcProbe" -}}
grpc:
  port: {{ int64 .port }}
  {{- if .service }}
  service: {{ .service | quote }}
  {{- end }}
periodSeconds: {{ int64 .settings.periodSeconds }}
timeoutSeconds: {{ int64 .settings.timeoutSeconds }}
failureThreshold: {{ int64 .settings.failureThreshold }}
{{- end }}

{{/*
The three probes of a container against grpc.health.v1: startup and readiness ask for the
node's own service (NOT_SERVING once a graceful stop begins), liveness for the server as a
whole (""). Call with (dict "port" P "service" S "probes" probeValues).
*/}}
{{- define "rmqstore.probes" -}}
startupProbe:
  {{- include "rmqstore.grpcProbe" (dict "port" .port "service" .service "settings" .probes.startup) | nindent 2 }}
readinessProbe:
  {{- include "rmqstore.grpcProbe" (dict "port" .port "service" .service "settings" .probes.readiness) | nindent 2 }}
livenessProbe:
  {{- include "rmqstore.grpcProbe" (dict "port" .port "service" "" "settings" .probes.liveness) | nindent 2 }}
{{- end }}

{{/* The writer container. */}}
{{- define "rmqstore.writerContainer" -}}
- name: writer
  image: {{ include "rmqstore.image" . | quote }}
  imagePullPolicy: {{ .Values.image.pullPolicy }}
  command:
    - rmqstore
  args:
    {{- include "rmqstore.writerArgs" . | nindent 4 }}
  ports:
    - name: grpc-writer
      containerPort: {{ int64 .Values.writer.port }}
      protocol: TCP
    {{- if .Values.tls.enabled }}
    - name: health-writer
      containerPort: {{ int64 .Values.writer.healthPort }}
      protocol: TCP
    {{- end }}
    {{- if .Values.metrics.prometheus.enabled }}
    - name: metrics-writer
      containerPort: {{ int64 .Values.writer.metricsPort }}
      protocol: TCP
    {{- end }}
  env:
    {{- include "rmqstore.env" (dict "root" . "component" "writer") | nindent 4 }}
    {{- if gt (int .Values.writer.replicas) 1 }}
    # The replica's id is its pod's ordinal (--replica-id "$(RMQSTORE_REPLICA_ID)").
    - name: RMQSTORE_REPLICA_ID
      valueFrom:
        fieldRef:
          fieldPath: metadata.labels['apps.kubernetes.io/pod-index']
    {{- end }}
  {{- include "rmqstore.probes" (dict "port" (include "rmqstore.probePort" (dict "root" . "component" .Values.writer)) "service" "rmqstore.v1.WriterService" "probes" .Values.writer.probes) | nindent 2 }}
  resources:
    {{- toYaml .Values.writer.resources | nindent 4 }}
  securityContext:
    {{- toYaml .Values.securityContext | nindent 4 }}
  volumeMounts:
    - name: data
      mountPath: {{ .Values.persistence.mountPath | quote }}
    - name: tmp
      mountPath: /tmp
    {{- if .Values.tls.enabled }}
    - name: tls
      mountPath: {{ .Values.tls.mountPath | quote }}
      readOnly: true
    {{- end }}
    {{- if .Values.acl.secretName }}
    - name: acl
      mountPath: {{ .Values.acl.mountPath | quote }}
      readOnly: true
    {{- end }}
{{- end }}

{{/* A query container: the store volume is always mounted read-only. */}}
{{- define "rmqstore.queryContainer" -}}
- name: query
  image: {{ include "rmqstore.image" . | quote }}
  imagePullPolicy: {{ .Values.image.pullPolicy }}
  command:
    - rmqstore
  args:
    {{- include "rmqstore.queryArgs" . | nindent 4 }}
  ports:
    - name: grpc-query
      containerPort: {{ int64 .Values.query.port }}
      protocol: TCP
    {{- if .Values.tls.enabled }}
    - name: health-query
      containerPort: {{ int64 .Values.query.healthPort }}
      protocol: TCP
    {{- end }}
    {{- if .Values.metrics.prometheus.enabled }}
    - name: metrics-query
      containerPort: {{ int64 .Values.query.metricsPort }}
      protocol: TCP
    {{- end }}
  env:
    {{- include "rmqstore.env" (dict "root" . "component" "query") | nindent 4 }}
  {{- include "rmqstore.probes" (dict "port" (include "rmqstore.probePort" (dict "root" . "component" .Values.query)) "service" "rmqstore.v1.QueryService" "probes" .Values.query.probes) | nindent 2 }}
  resources:
    {{- toYaml .Values.query.resources | nindent 4 }}
  securityContext:
    {{- toYaml .Values.securityContext | nindent 4 }}
  volumeMounts:
    - name: data
      mountPath: {{ .Values.persistence.mountPath | quote }}
      readOnly: true
    - name: tmp
      mountPath: /tmp
    {{- if .Values.tls.enabled }}
    - name: tls
      mountPath: {{ .Values.tls.mountPath | quote }}
      readOnly: true
    {{- end }}
    {{- if .Values.acl.secretName }}
    - name: acl
      mountPath: {{ .Values.acl.mountPath | quote }}
      readOnly: true
    {{- end }}
{{- end }}

{{/* Volumes besides the store: a small writable /tmp, and the TLS Secret when enabled. */}}
{{- define "rmqstore.extraVolumes" -}}
- name: tmp
  emptyDir:
    sizeLimit: {{ .Values.tmpSizeLimit | quote }}
{{- if .Values.tls.enabled }}
- name: tls
  secret:
    secretName: {{ .Values.tls.secretName | quote }}
    defaultMode: 0440
{{- end }}
{{- if .Values.acl.secretName }}
- name: acl
  secret:
    secretName: {{ .Values.acl.secretName | quote }}
    defaultMode: 0440
    items:
      - key: acl.yaml
        path: acl.yaml
{{- end }}
{{- end }}

{{/* Rules between values that values.schema.json cannot state. */}}
{{- define "rmqstore.validate" -}}
{{- if gt (float64 .Values.store.diskCleanRatio) (float64 .Values.store.diskFullRatio) }}
{{- fail (printf "store.diskCleanRatio (%v) must not exceed store.diskFullRatio (%v): old files are cleaned before writes are refused" .Values.store.diskCleanRatio .Values.store.diskFullRatio) }}
{{- end }}
{{- if eq (int64 .Values.writer.port) (int64 .Values.query.port) }}
{{- fail (printf "writer.port and query.port must differ (both %v): in sidecar mode they share one pod" .Values.writer.port) }}
{{- end }}
{{- if .Values.tls.enabled }}
{{- $ports := list (int64 .Values.writer.port) (int64 .Values.query.port) (int64 .Values.writer.healthPort) (int64 .Values.query.healthPort) }}
{{- if ne (len $ports) (len (uniq $ports)) }}
{{- fail (printf "writer.port, query.port, writer.healthPort and query.healthPort must all differ (%v): in sidecar mode they share one pod" $ports) }}
{{- end }}
{{- end }}
{{- if .Values.metrics.prometheus.enabled }}
{{- $ports := list (int64 .Values.writer.port) (int64 .Values.query.port) (int64 .Values.writer.metricsPort) (int64 .Values.query.metricsPort) }}
{{- if .Values.tls.enabled }}
{{- $ports = concat $ports (list (int64 .Values.writer.healthPort) (int64 .Values.query.healthPort)) }}
{{- end }}
{{- if ne (len $ports) (len (uniq $ports)) }}
{{- fail (printf "writer.metricsPort and query.metricsPort must differ from each other and from the nodes' other ports (%v): in sidecar mode they share one pod" $ports) }}
{{- end }}
{{- end }}
{{- if not (or .Values.acl.secretName (and .Values.tls.enabled .Values.tls.clientAuth) .Values.insecureOpen) }}
{{- fail "the nodes listen on every pod address: set acl.secretName (an ACL), tls.clientAuth (mutual TLS) or insecureOpen: true (anyone who reaches the Services may call)" }}
{{- end }}
{{- if gt (int .Values.writer.replicas) 1 }}
{{- if not (semverCompare ">=1.28-0" .Capabilities.KubeVersion.Version) }}
{{- fail "a writer group (writer.replicas > 1) needs Kubernetes 1.28 or later: each replica takes its id from its pod's apps.kubernetes.io/pod-index label" }}
{{- end }}
{{- if gt (int .Values.writer.group.minInsync) (int .Values.writer.replicas) }}
{{- fail (printf "writer.group.minInsync (%v) must not exceed writer.replicas (%v)" .Values.writer.group.minInsync .Values.writer.replicas) }}
{{- end }}
{{- if and .Values.acl.secretName (not (and .Values.tls.enabled .Values.tls.clientAuth)) }}
{{- fail "a writer group under an ACL needs tls.enabled and tls.clientAuth: the replicas know each other by their certificates (docs/replication.md)" }}
{{- end }}
{{- if not (or .Values.writer.group.etcd .Values.etcd.enabled) }}
{{- fail "a writer group (writer.replicas > 1) elects its primary through etcd: list its members in writer.group.etcd or set etcd.enabled: true" }}
{{- end }}
{{- else if .Values.etcd.enabled }}
{{- fail "etcd.enabled serves a writer group's election: set writer.replicas above 1, or leave etcd off" }}
{{- end }}
{{- if .Values.groups }}
{{- if .Values.store.storeHost }}
{{- fail "store.storeHost names one writer: with groups each group's writers get their own (127.0.0.<K+1>:<writer.port> for the K-th group); leave store.storeHost empty" }}
{{- end }}
{{- if .Values.writer.advertise }}
{{- fail "writer.advertise names one writer: with groups each group's writers advertise their own Service (clients reach the groups through the proxies); leave writer.advertise empty" }}
{{- end }}
{{- if and .Values.console.enabled (not .Values.proxy.enabled) }}
{{- fail "console.enabled with groups reads through the proxies: set proxy.enabled" }}
{{- end }}
{{- end }}
{{- if .Values.proxy.enabled }}
{{- if and .Values.acl.secretName (not (or .Values.proxy.upstreamCredentialsSecret .Values.tls.clientAuth)) }}
{{- fail "proxy.enabled under an ACL: the nodes check the proxies too; give proxy.upstreamCredentialsSecret (the user they sign as) or tls.clientAuth (the nodes then know them as Cert:<common name>) (docs/cluster.md, \"Security\")" }}
{{- end }}
{{- if gt (int64 .Values.proxy.autoscaling.minReplicas) (int64 .Values.proxy.autoscaling.maxReplicas) }}
{{- fail "proxy.autoscaling.minReplicas must not exceed maxReplicas" }}
{{- end }}
{{- end }}
{{- if gt (int64 .Values.query.autoscaling.minReplicas) (int64 .Values.query.autoscaling.maxReplicas) }}
{{- fail "query.autoscaling.minReplicas must not exceed maxReplicas" }}
{{- end }}
{{- if .Values.console.enabled }}
{{- if and .Values.console.usersSecret .Values.console.noAuth }}
{{- fail "console: give usersSecret or noAuth, not both" }}
{{- end }}
{{- if not (or .Values.console.usersSecret .Values.console.noAuth) }}
{{- fail "console.enabled needs console.usersSecret (a users file) or, behind something that authenticates, console.noAuth: true" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "rmqstore.consoleName" -}}
{{- printf "%s-console" (include "rmqstore.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
The console's command line: the query and writer Services by their in-cluster names
(the names a TLS certificate holds), or with proxies the proxy Service alone (a proxy
answers lookups for every group; a writer's status describes one writer); a users file or
--no-auth.
*/}}
{{- define "rmqstore.consoleArgs" -}}
{{- $tls := .Values.tls }}
- console
{{- if .Values.proxy.enabled }}
- --query-endpoint
- {{ printf "%s.%s.svc:%d" (include "rmqstore.proxyName" .) .Release.Namespace (int64 .Values.proxy.port) | quote }}
{{- else }}
- --query-endpoint
- {{ printf "%s.%s.svc:%d" (include "rmqstore.queryName" .) .Release.Namespace (int64 .Values.query.port) | quote }}
- --writer-endpoint
- {{ printf "%s.%s.svc:%d" (include "rmqstore.writerName" .) .Release.Namespace (int64 .Values.writer.port) | quote }}
{{- end }}
- --host
- "0.0.0.0"
- --port
- {{ int64 .Values.console.port | quote }}
{{- if .Values.console.usersSecret }}
- --users
- "/etc/rmqstore/console/users"
{{- else }}
- --no-auth
{{- end }}
{{- if $tls.enabled }}
{{- $dir := trimSuffix "/" $tls.mountPath }}
- --tls-ca
- {{ printf "%s/ca.crt" $dir | quote }}
{{- if $tls.clientAuth }}
- --tls-client-cert
- {{ printf "%s/tls.crt" $dir | quote }}
- --tls-client-key
- {{ printf "%s/tls.key" $dir | quote }}
{{- end }}
{{- end }}
{{- end }}

{{/* An HTTP probe of the console; call with (dict "path" P "settings" probeValues). */}}
{{- define "rmqstore.httpProbe" -}}
httpGet:
  path: {{ .path }}
  port: http
periodSeconds: {{ int64 .settings.periodSeconds }}
timeoutSeconds: {{ int64 .settings.timeoutSeconds }}
failureThreshold: {{ int64 .settings.failureThreshold }}
{{- end }}

{{/* A pod's annotations: its own, and with Prometheus metrics on the scrape annotations
naming its metrics port (an annotation set in podAnnotations wins); call with
(dict "root" $ "component" .Values.writer|.Values.query). */}}
{{- define "rmqstore.podAnnotations" -}}
{{- $annotations := deepCopy (.component.podAnnotations | default dict) }}
{{- if .root.Values.metrics.prometheus.enabled }}
{{- $annotations = merge $annotations (dict "prometheus.io/scrape" "true" "prometheus.io/port" (toString (int64 .component.metricsPort)) "prometheus.io/path" "/metrics") }}
{{- end }}
{{- with $annotations }}
annotations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{/*
A group's entry of the proxies' cluster file (proxy/cluster.py), from its group context:
its writers by their pods' stable names under the writer's headless Service (one, or a
writer group's replicas in order), its query nodes by their Service.
*/}}
{{- define "rmqstore.clusterGroup" -}}
{{- $writer := include "rmqstore.writerName" . }}
{{- $writers := list }}
{{- range $k := until (int .Values.writer.replicas) }}
{{- $writers = append $writers (printf "%s-%d.%s.%s.svc:%d" $writer $k $writer $.Release.Namespace (int64 $.Values.writer.port)) }}
{{- end }}
name: {{ .Values.writer.brokerName | quote }}
writers:
  {{- toYaml $writers | nindent 2 }}
queries:
  - {{ printf "%s.%s.svc:%d" (include "rmqstore.queryName" .) .Release.Namespace (int64 .Values.query.port) | quote }}
{{- end }}
