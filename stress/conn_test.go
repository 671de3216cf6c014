package stress

import (
	"context"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"

	arbor "github.com/arbor-env/arbor/clients/go"
)

// conn is a clients/go connection through a loopback TCP relay of the
// test's own, so that the test can cut it abruptly (no close frame: the
// server sees the socket die, as when a client host goes away) and stop
// reading the server's answers for a while (a slow reader: the server's
// writes back up in the kernel's socket buffers).
type conn struct {
	*arbor.Client
	ln      net.Listener
	mu      sync.Mutex
	sides   []net.Conn
	dropped atomic.Bool // set before the test cuts it
	paused  chan struct{}
	pauseMu sync.Mutex
}

// dial opens a relayed connection to addr.
func dial(ctx context.Context, addr string) (*conn, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	c := &conn{ln: ln}
	go c.relay(addr)
	cl, err := arbor.Dial(ctx, ln.Addr().String(), nil)
	if err != nil {
		ln.Close()
		return nil, err
	}
	c.Client = cl
	return c, nil
}

func (c *conn) relay(addr string) {
	in, err := c.ln.Accept()
	c.ln.Close()
	if err != nil {
		return
	}
	out, err := net.Dial("tcp", addr)
	if err != nil {
		in.Close()
		return
	}
	c.mu.Lock()
	c.sides = []net.Conn{in, out}
	c.mu.Unlock()
	go func() { io.Copy(out, in); out.(*net.TCPConn).CloseWrite() }()
	buf := make([]byte, 64<<10)
	for {
		c.waitUnpaused()
		n, err := out.Read(buf)
		if n > 0 {
			if _, werr := in.Write(buf[:n]); werr != nil {
				break
			}
		}
		if err != nil {
			break
		}
	}
	in.Close()
	out.Close()
}

func (c *conn) waitUnpaused() {
	c.pauseMu.Lock()
	p := c.paused
	c.pauseMu.Unlock()
	if p != nil {
		<-p
	}
}

// pause stops relaying the server's answers for d.
func (c *conn) pause(d time.Duration) {
	ch := make(chan struct{})
	c.pauseMu.Lock()
	if c.paused != nil {
		c.pauseMu.Unlock()
		return
	}
	c.paused = ch
	c.pauseMu.Unlock()
	time.AfterFunc(d, func() {
		c.pauseMu.Lock()
		c.paused = nil
		c.pauseMu.Unlock()
		close(ch)
	})
}

// drop cuts the connection: both sockets of the relay are reset, no
// close frame is sent. Calls in flight fail with arbor.ErrClosed.
func (c *conn) drop() {
	c.dropped.Store(true)
	c.mu.Lock()
	for _, s := range c.sides {
		if tc, ok := s.(*net.TCPConn); ok {
			tc.SetLinger(0) // RST, not FIN
		}
		s.Close()
	}
	c.mu.Unlock()
	c.Client.Close()
}

// close ends the connection cleanly.
func (c *conn) close() {
	c.Client.Close()
	c.mu.Lock()
	for _, s := range c.sides {
		s.Close()
	}
	c.mu.Unlock()
}
