package server

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
)

// metrics are the server's Prometheus collectors (the coordinator has
// those of turns, branches and checkpoints). No label carries an env or
// state id: those are unbounded.
type metrics struct {
	requests *prometheus.CounterVec
	conns    prometheus.Gauge
	inFlight prometheus.Gauge
	unread   prometheus.Gauge
}

func newMetrics(reg prometheus.Registerer, answers func() float64) *metrics {
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "arbor_requests_total", Help: "Requests answered, by method and result code (ok or an error code).",
		}, []string{"method", "code"}),
		conns: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "arbor_connections", Help: "Open websocket connections.",
		}),
		inFlight: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "arbor_requests_in_flight", Help: "Requests being served.",
		}),
		unread: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "arbor_unread_bytes", Help: "Bytes of answers queued for clients and not yet written, all connections (each bounded by max_unread_bytes).",
		}),
	}
	reg.MustRegister(m.requests, m.conns, m.inFlight, m.unread,
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "arbor_answer_bytes", Help: "Bytes of answers held, all connections: queued or being written, plus what running steps may still output (bounded by max_answer_bytes).",
		}, answers),
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}
