package image

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"
)

// Registry is how a Store reaches OCI registries (docs/images.md,
// "Pulling").
type Registry struct {
	// Insecure lists registries (host or host:port) that may be reached
	// over plain HTTP. Loopback registries (localhost, 127.0.0.0/8, ::1)
	// always may, as Docker allows; every other one is HTTPS only.
	Insecure []string
	// Auth holds credentials by registry (host or host:port), used before
	// the Docker config file's (DOCKER_CONFIG, ~/.docker/config.json).
	Auth map[string]authn.AuthConfig
	// Platform picks an image from a multi-platform index; the zero value
	// is linux on this machine's architecture.
	Platform v1.Platform
	// Transport is the HTTP transport under the registry client (tests);
	// http.DefaultTransport when nil.
	Transport http.RoundTripper
	// Attempts is how many times a failed layer download is tried (0: 3);
	// each request also has the registry client's own retries.
	Attempts int
	// PullFrom lists the registries (host or host:port) that Resolve may
	// pull from on a client's behalf (a reset, a task); nil or "*": any.
	// A non-nil empty list allows none: clients then get only images the
	// operator pulled (Pull, arbor image pull, which it does not limit).
	// Without it any client could make the server fetch from any host it
	// names, loopback services included.
	PullFrom []string
}

// mayPull reports whether Resolve may pull from registry host.
func (r Registry) mayPull(host string) bool {
	if r.PullFrom == nil {
		return true
	}
	return slices.Contains(r.PullFrom, "*") || slices.Contains(r.PullFrom, host)
}

// IsReference reports whether s names an image in a registry rather than
// an image of the local store: a local name has no '/', ':' or '@'
// ("debian", "swe-1234"), a reference has a repository path, a tag or a
// digest ("127.0.0.1:5000/swe/django:1234", "alpine:3.20",
// "repo@sha256:...").
func IsReference(s string) bool { return strings.ContainsAny(s, "/:@") }

// parseReference parses a registry reference strictly enough that a typo
// is an error, not a pull from somewhere else.
func parseReference(ref string) (name.Reference, error) {
	r, err := name.ParseReference(ref)
	if err != nil {
		return nil, fmt.Errorf("%w: %q: %v", ErrInvalidName, ref, err)
	}
	return r, nil
}

func (r Registry) platform() v1.Platform {
	p := r.Platform
	if p.OS == "" {
		p.OS = "linux"
	}
	if p.Architecture == "" {
		p.Architecture = runtime.GOARCH
	}
	return p
}

// keychain is the credentials of r.Auth, then the Docker config file's.
func (r Registry) keychain() authn.Keychain {
	return authn.NewMultiKeychain(staticKeychain(r.Auth), authn.DefaultKeychain)
}

type staticKeychain map[string]authn.AuthConfig

func (k staticKeychain) Resolve(res authn.Resource) (authn.Authenticator, error) {
	if c, ok := k[res.RegistryStr()]; ok {
		return authn.FromConfig(c), nil
	}
	return authn.Anonymous, nil
}

// options are the registry client's options for one operation.
func (r Registry) options(ctx context.Context) []remote.Option {
	base := r.Transport
	if base == nil {
		base = remote.DefaultTransport
	}
	return []remote.Option{
		remote.WithContext(ctx),
		remote.WithAuthFromKeychain(r.keychain()),
		remote.WithPlatform(r.platform()),
		remote.WithTransport(httpGuard{base: base, insecure: r.Insecure}),
		remote.WithUserAgent("arbor"),
		remote.WithRetryBackoff(remote.Backoff{Duration: 500 * time.Millisecond, Factor: 2, Jitter: 0.1, Steps: 4}),
	}
}

// httpGuard refuses plain HTTP to any registry but a loopback one or one
// listed as insecure. The registry client falls back to HTTP on its own
// for private (RFC 1918) addresses too; a man in the middle there could
// then serve any image, so it is refused unless the user says so.
type httpGuard struct {
	base     http.RoundTripper
	insecure []string
}

func (g httpGuard) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.URL.Scheme == "http" && !g.plainAllowed(req.URL.Host) {
		return nil, fmt.Errorf("plain HTTP to %s refused (not loopback): pass --insecure-registry %s if it serves no TLS", req.URL.Host, req.URL.Host)
	}
	return g.base.RoundTrip(req)
}

func (g httpGuard) plainAllowed(host string) bool {
	if slices.Contains(g.insecure, host) {
		return true
	}
	h := host
	if hh, _, err := net.SplitHostPort(host); err == nil {
		h = hh
		if slices.Contains(g.insecure, h) {
			return true
		}
	}
	if h == "localhost" {
		return true
	}
	ip := net.ParseIP(h)
	return ip != nil && ip.IsLoopback()
}

// pullError words a registry failure: missing repositories, tags and
// refused credentials name themselves; the rest keep the client's words.
func pullError(ref string, err error) error {
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	var te *transport.Error
	if errors.As(err, &te) {
		switch te.StatusCode {
		case http.StatusUnauthorized, http.StatusForbidden:
			return fmt.Errorf("%w %s: the registry refused the credentials (docs/images.md, \"Credentials\"): %v", ErrPull, ref, err)
		case http.StatusNotFound:
			return fmt.Errorf("%w %s: no such repository, tag or digest: %v", ErrPull, ref, err)
		}
	}
	var dns *net.DNSError
	if errors.As(err, &dns) {
		return fmt.Errorf("%w %s: unknown registry host %s: %v", ErrPull, ref, dns.Name, err)
	}
	return fmt.Errorf("%w %s: %v", ErrPull, ref, err)
}
