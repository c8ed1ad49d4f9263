package gateserve

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"moat.dev/moat/internal/audit"
)

// metrics are the service's Prometheus series. Decisions are counted from
// the audit records as they are written (audit.Log.Tap), so a metric and
// the audit can never disagree, and no label carries anything but words
// the gate chose: a tenant's name, a verdict, a step, a fixed reason. No
// name, path or value a client sent becomes a label (unbounded series, and
// a place for a secret to leak).
type metrics struct {
	reg        *prometheus.Registry
	decisions  *prometheus.CounterVec
	bytes      *prometheus.CounterVec
	open       *prometheus.GaugeVec
	dns        *prometheus.CounterVec
	dnsDropped *prometheus.CounterVec
	reloads    prometheus.Counter
}

func newMetrics() *metrics {
	m := &metrics{reg: prometheus.NewRegistry()}
	m.decisions = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "moat_gate_decisions_total",
		Help: "Connections and requests decided, by tenant (\"\" for unknown sources), protocol, verdict, the step that rejected it and the reason's fixed part.",
	}, []string{"tenant", "proto", "verdict", "rejected_by", "reason"})
	m.bytes = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "moat_gate_bytes_total",
		Help: "Bytes carried through the gate by ended connections, by tenant and direction (up: client to upstream).",
	}, []string{"tenant", "direction"})
	m.open = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "moat_gate_open_connections",
		Help: "TCP connections the gate holds open now, by tenant.",
	}, []string{"tenant"})
	m.dns = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "moat_gate_dns_answers_total",
		Help: "DNS queries answered, by tenant and verdict (deny: answered by the gate without asking upstream).",
	}, []string{"tenant", "verdict"})
	m.dnsDropped = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "moat_gate_dns_dropped_total",
		Help: "DNS queries dropped because the tenant had too many in flight.",
	}, []string{"tenant"})
	m.reloads = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "moat_gate_reloads_total",
		Help: "Reloads applied (SIGHUP).",
	})
	m.reg.MustRegister(m.decisions, m.bytes, m.open, m.dns, m.dnsDropped, m.reloads)
	return m
}

// tap is the audit tap that counts tenant's records.
func (m *metrics) tap(tenant string) func(audit.Record) {
	return func(r audit.Record) {
		switch {
		case r.Verdict == audit.Dropped:
			return
		case r.Phase == audit.PhaseEnd:
			m.bytes.WithLabelValues(tenant, "up").Add(float64(r.BytesUp))
			m.bytes.WithLabelValues(tenant, "down").Add(float64(r.BytesDown))
			return
		case r.Proto == "dns" && r.RejectedBy != audit.StepSource:
			m.dns.WithLabelValues(tenant, string(r.Verdict)).Inc()
			return
		}
		m.decisions.WithLabelValues(tenant, r.Proto, string(r.Verdict), r.RejectedBy, reasonLabel(r)).Inc()
	}
}

// fixedReasons are the reasons a label may name; any other is "other".
var fixedReasons = []audit.Reason{
	audit.ReasonNoRule, audit.ReasonBlocked, audit.ReasonRefusedClass, audit.ReasonBadHead,
	audit.ReasonMalformedHello, audit.ReasonUnrecorded, audit.ReasonTooManyConns, audit.ReasonNeedsInspection,
	audit.ReasonUpstream, audit.ReasonConnect, audit.ReasonHostMismatch, audit.ReasonSecretInClear,
	audit.ReasonTooManyRequests, audit.ReasonNotByName, audit.ReasonUnknownSource, audit.ReasonTLSTerminated,
}

func reasonLabel(r audit.Record) string {
	if r.Reason == "" {
		return ""
	}
	for _, f := range fixedReasons {
		if r.Reason.Is(f) {
			return string(f)
		}
	}
	if strings.HasSuffix(string(r.Reason), string(audit.NamelessToGate(""))) {
		return "no name"
	}
	return "other"
}

// serveMetrics serves /metrics and /healthz on l until ctx ends.
func (s *Service) serveMetrics(ctx context.Context, l net.Listener) {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(s.metrics.reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, r *http.Request) {
		if err := s.health(); err != nil {
			http.Error(w, "unhealthy: "+err.Error(), http.StatusServiceUnavailable)
			return
		}
		tt := s.tenants.Load()
		fmt.Fprintf(w, "ok: %d tenants, up %s\n", len(tt.byName)+len(tt.byAddr), time.Since(s.started).Round(time.Second))
	})
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	stop := context.AfterFunc(ctx, func() { srv.Close() })
	defer stop()
	if err := srv.Serve(l); err != nil && !errors.Is(err, http.ErrServerClosed) && ctx.Err() == nil {
		s.log.Error("gate service: the metrics listener stopped", "err", err)
	}
}

// health is why the service cannot serve now, or nil: an audit log that
// cannot be written stops the tenant's traffic (the gate lets nothing
// through unrecorded), which is what a health check must report.
func (s *Service) health() error {
	var errs []error
	if err := s.unknown.Failing(); err != nil {
		errs = append(errs, fmt.Errorf("audit log for unknown sources: %w", err))
	}
	if s.kube != nil {
		if err := s.kube.health(); err != nil {
			errs = append(errs, err)
		}
	}
	for name, t := range s.tenants.Load().byName {
		if err := t.audit.Failing(); err != nil {
			errs = append(errs, fmt.Errorf("tenant %s: audit log: %w", name, err))
		}
	}
	return errors.Join(errs...)
}
