package server

// Backlog is one connection's account of unread answers, for tests.
type Backlog struct {
	Held, Peak int64 // bytes queued for the writer now, and the most ever
	Paused     bool  // the read loop waits for the client to read
	Gated      int64 // requests read but not started for that reason
}

// Backlogs returns the backlog of every open connection.
func (s *Server) Backlogs() []Backlog {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []Backlog
	for c := range s.conns {
		held, peak := c.ob.stats()
		out = append(out, Backlog{Held: held, Peak: peak, Paused: c.paused.Load(), Gated: c.gated.Load()})
	}
	return out
}

// OpenEnvSessions lists the sessions the OpenEnv endpoint holds, for tests.
func (s *Server) OpenEnvSessions() []string {
	s.oe.mu.Lock()
	defer s.oe.mu.Unlock()
	var ids []string
	for id := range s.oe.held {
		ids = append(ids, id)
	}
	return ids
}
