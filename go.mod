module github.com/arbor-env/arbor

go 1.26.0

require (
	github.com/checkpoint-restore/go-criu/v7 v7.2.0
	github.com/cilium/ebpf v0.22.0
	github.com/hashicorp/golang-lru/v2 v2.0.7
	github.com/mistifyio/go-zfs/v3 v3.0.1
	github.com/spf13/cobra v1.10.2
	go.etcd.io/bbolt v1.5.0
	golang.org/x/sys v0.50.0
	google.golang.org/protobuf v1.34.2
)

require (
	github.com/google/uuid v1.2.0 // indirect
	github.com/inconshreveable/mousetrap v1.1.0 // indirect
	github.com/spf13/pflag v1.0.10 // indirect
)
