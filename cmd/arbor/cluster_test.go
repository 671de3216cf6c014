package main

import (
	"context"
	"net"
	"strings"
	"testing"
)

// TestClusterFlags checks what arbor serve refuses before it dials etcd.
func TestClusterFlags(t *testing.T) {
	listen := &net.TCPAddr{IP: net.IPv4(127, 0, 0, 2), Port: 7878}
	unspec := &net.TCPAddr{IP: net.IPv4zero, Port: 7878}
	tests := []struct {
		name   string
		f      clusterFlags
		listen net.Addr
		err    string // "" : no node and no error
	}{
		{"no cluster", clusterFlags{}, listen, ""},
		{"slash in id", clusterFlags{etcd: "http://127.0.0.1:1", nodeID: "a/b"}, listen, "no slashes"},
		{"unspecified listen, no advertise", clusterFlags{etcd: "http://127.0.0.1:1", nodeID: "a"}, unspec, "give --advertise"},
		{"advertise without port", clusterFlags{etcd: "http://127.0.0.1:1", nodeID: "a", advertise: "127.0.0.2"}, listen, "want host:port"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			n, err := tt.f.connect(context.Background(), tt.listen, nil)
			if n != nil {
				n.Close()
				t.Fatal("a node was made")
			}
			if tt.err == "" && err != nil || tt.err != "" && (err == nil || !strings.Contains(err.Error(), tt.err)) {
				t.Errorf("err %v, want %q", err, tt.err)
			}
		})
	}
	if got := splitURLs(" http://a:1, ,http://b:2 "); len(got) != 2 || got[0] != "http://a:1" || got[1] != "http://b:2" {
		t.Errorf("splitURLs: %q", got)
	}
}
