package main

import (
	"errors"
	"io"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"
)

// The Kubernetes manifests in deploy/kubernetes (docs/cluster.md,
// "Deployment") are checked against the binary they run, so that they
// cannot drift from its flags and ports.

const deployDir = "../../deploy/kubernetes"

type k8sObject struct {
	Kind     string `yaml:"kind"`
	Metadata struct {
		Name string `yaml:"name"`
	} `yaml:"metadata"`
	Spec struct {
		Selector    yaml.Node `yaml:"selector"`
		ServiceName string    `yaml:"serviceName"`
		Ports       []struct {
			Name       string    `yaml:"name"`
			Port       int       `yaml:"port"`
			TargetPort yaml.Node `yaml:"targetPort"`
		} `yaml:"ports"`
		Template struct {
			Metadata struct {
				Labels map[string]string `yaml:"labels"`
			} `yaml:"metadata"`
			Spec struct {
				Containers []k8sContainer `yaml:"containers"`
			} `yaml:"spec"`
		} `yaml:"template"`
	} `yaml:"spec"`
}

type k8sContainer struct {
	Name  string   `yaml:"name"`
	Image string   `yaml:"image"`
	Args  []string `yaml:"args"`
	Env   []struct {
		Name string `yaml:"name"`
	} `yaml:"env"`
	Ports []struct {
		Name          string `yaml:"name"`
		ContainerPort int    `yaml:"containerPort"`
	} `yaml:"ports"`
	ReadinessProbe *k8sProbe `yaml:"readinessProbe"`
	LivenessProbe  *k8sProbe `yaml:"livenessProbe"`
}

type k8sProbe struct {
	HTTPGet struct {
		Path string    `yaml:"path"`
		Port yaml.Node `yaml:"port"`
	} `yaml:"httpGet"`
}

func (c k8sContainer) port(name string) int {
	for _, p := range c.Ports {
		if p.Name == name {
			return p.ContainerPort
		}
	}
	return 0
}

func loadManifests(t *testing.T) (objs []k8sObject, resources []string) {
	t.Helper()
	ents, err := os.ReadDir(deployDir)
	if err != nil {
		t.Fatal(err)
	}
	var files []string
	for _, e := range ents {
		if strings.HasSuffix(e.Name(), ".yaml") && e.Name() != "kustomization.yaml" {
			files = append(files, e.Name())
		}
	}
	b, err := os.ReadFile(filepath.Join(deployDir, "kustomization.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var k struct {
		Resources []string `yaml:"resources"`
		Images    []struct {
			Name string `yaml:"name"`
		} `yaml:"images"`
	}
	if err := yaml.Unmarshal(b, &k); err != nil {
		t.Fatalf("kustomization.yaml: %v", err)
	}
	slices.Sort(files)
	res := slices.Sorted(slices.Values(k.Resources))
	if !slices.Equal(files, res) {
		t.Errorf("kustomization.yaml resources %v, files %v: every manifest listed, nothing missing", res, files)
	}
	for _, f := range files {
		fh, err := os.Open(filepath.Join(deployDir, f))
		if err != nil {
			t.Fatal(err)
		}
		dec := yaml.NewDecoder(fh)
		for {
			var o k8sObject
			if err := dec.Decode(&o); errors.Is(err, io.EOF) {
				break
			} else if err != nil {
				t.Fatalf("%s: %v", f, err)
			}
			objs = append(objs, o)
		}
		fh.Close()
	}
	for _, o := range objs {
		for _, c := range o.Spec.Template.Spec.Containers {
			if !slices.ContainsFunc(k.Images, func(i struct {
				Name string `yaml:"name"`
			}) bool {
				return i.Name == c.Image
			}) {
				t.Errorf("%s/%s: image %q has no entry in kustomization.yaml images", o.Metadata.Name, c.Name, c.Image)
			}
		}
	}
	return objs, k.Resources
}

var envRef = regexp.MustCompile(`\$\(([A-Z_]+)\)`)

// TestKubernetesManifests: every arbor container's arguments parse as the
// flags of the subcommand it runs (unknown flags and bad values fail),
// every $(VAR) they use is in the container's env, the listen and
// advertise ports are the container's "ws" port that the probes and the
// Services use, a container listening off loopback has its token, and the
// etcd URLs name the etcd Service's client port.
func TestKubernetesManifests(t *testing.T) {
	objs, _ := loadManifests(t)
	byLabels := func(sel map[string]string) []k8sContainer {
		var out []k8sContainer
		for _, o := range objs {
			match := len(sel) > 0
			for k, v := range sel {
				match = match && o.Spec.Template.Metadata.Labels[k] == v
			}
			if match {
				out = append(out, o.Spec.Template.Spec.Containers...)
			}
		}
		return out
	}
	// Services: each one's target port is a named port of the pods it
	// selects; remember the etcd Service's client port.
	etcdPorts := map[string]int{} // service name -> client port
	var arborRuns []string
	for _, o := range objs {
		if o.Kind != "Service" {
			continue
		}
		var sel map[string]string
		if err := o.Spec.Selector.Decode(&sel); err != nil {
			t.Fatalf("service %s selector: %v", o.Metadata.Name, err)
		}
		pods := byLabels(sel)
		if len(pods) == 0 {
			t.Errorf("service %s selects no pod template", o.Metadata.Name)
		}
		for _, p := range o.Spec.Ports {
			target := p.TargetPort.Value
			if target == "" {
				target = p.Name
			}
			found := slices.ContainsFunc(pods, func(c k8sContainer) bool {
				return c.port(target) != 0 || slices.ContainsFunc(c.Ports, func(cp struct {
					Name          string `yaml:"name"`
					ContainerPort int    `yaml:"containerPort"`
				}) bool {
					return target == "" && cp.ContainerPort == p.Port
				})
			})
			if !found {
				t.Errorf("service %s port %s: no container port %q in the pods it selects", o.Metadata.Name, p.Name, target)
			}
			if p.Name == "client" {
				etcdPorts[o.Metadata.Name] = p.Port
			}
		}
	}
	for _, o := range objs {
		for _, c := range o.Spec.Template.Spec.Containers {
			if c.Image != "arbor-image" {
				continue
			}
			where := o.Kind + " " + o.Metadata.Name
			if len(c.Args) == 0 {
				t.Errorf("%s: no arguments", where)
				continue
			}
			env := map[string]bool{}
			for _, e := range c.Env {
				env[e.Name] = true
			}
			args := make([]string, len(c.Args))
			for i, a := range c.Args {
				args[i] = envRef.ReplaceAllStringFunc(a, func(m string) string {
					name := envRef.FindStringSubmatch(m)[1]
					if !env[name] {
						t.Errorf("%s: argument %q uses $(%s), which the container's env does not set", where, a, name)
					}
					return "10.0.0.7" // what Kubernetes puts there: a pod IP, a node name
				})
			}
			root := newRootCmd()
			cmd, rest, err := root.Find(args)
			if err != nil || cmd == root {
				t.Errorf("%s: %q is not an arbor subcommand: %v", where, args[0], err)
				continue
			}
			if err := cmd.ParseFlags(rest); err != nil {
				t.Errorf("%s: arbor %s refuses its arguments: %v", where, cmd.Name(), err)
				continue
			}
			if extra := cmd.Flags().Args(); len(extra) > 0 {
				t.Errorf("%s: arguments %q are not flags of arbor %s", where, extra, cmd.Name())
			}
			arborRuns = append(arborRuns, cmd.Name())
			ws := c.port("ws")
			if ws == 0 {
				t.Errorf("%s: no container port named ws", where)
			}
			listen := cmd.Flags().Lookup("listen").Value.String()
			host, port, err := net.SplitHostPort(listen)
			if err != nil || port != strconv.Itoa(ws) {
				t.Errorf("%s: --listen %q, want the ws port %d", where, listen, ws)
			}
			if host != "127.0.0.1" && !env["ARBOR_TOKEN"] {
				t.Errorf("%s: listens on %s without ARBOR_TOKEN (arbor refuses to start)", where, listen)
			}
			if f := cmd.Flags().Lookup("advertise"); f != nil && f.Value.String() != "" {
				if _, p, err := net.SplitHostPort(f.Value.String()); err != nil || p != port {
					t.Errorf("%s: --advertise %q, want the listen port %s", where, f.Value, port)
				}
			}
			for _, pr := range []*k8sProbe{c.ReadinessProbe, c.LivenessProbe} {
				if pr == nil {
					t.Errorf("%s: readiness and liveness probes are both wanted", where)
					continue
				}
				if pr.HTTPGet.Path != "/readyz" && pr.HTTPGet.Path != "/livez" {
					t.Errorf("%s: probe path %q is not one arbor serves", where, pr.HTTPGet.Path)
				}
				if p := pr.HTTPGet.Port.Value; p != "ws" && p != strconv.Itoa(ws) {
					t.Errorf("%s: probe port %q, want ws", where, p)
				}
			}
			for _, name := range []string{"cluster-etcd", "etcd"} {
				f := cmd.Flags().Lookup(name)
				if f == nil {
					continue
				}
				if f.Value.String() == "" {
					t.Errorf("%s: --%s is empty", where, name)
				}
				for _, s := range strings.Split(f.Value.String(), ",") {
					u, err := url.Parse(s)
					if err != nil {
						t.Errorf("%s: --%s %q: %v", where, name, s, err)
						continue
					}
					// etcd-0.etcd: a pod of the StatefulSet behind the
					// headless Service etcd.
					parts := strings.Split(u.Hostname(), ".")
					svc := parts[len(parts)-1]
					if p, ok := etcdPorts[svc]; !ok || u.Port() != strconv.Itoa(p) {
						t.Errorf("%s: --%s %q: want a host of the etcd Service and its client port (%v)", where, name, s, etcdPorts)
					}
				}
			}
		}
	}
	slices.Sort(arborRuns)
	if !slices.Equal(arborRuns, []string{"router", "serve"}) {
		t.Errorf("arbor containers run %v, want one node (serve) and one router", arborRuns)
	}
}
