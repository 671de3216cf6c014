package manifest

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"time"

	bolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"
)

// SchemaVersion is the schema this package writes and reads.
const SchemaVersion = 1

// DefaultLockTimeout is how long Open waits for another opener to let go
// of the file before failing with ErrLocked.
const DefaultLockTimeout = 2 * time.Second

var (
	bucketMeta      = []byte("meta")
	bucketEnvs      = []byte("envs")
	bucketStates    = []byte("states")
	bucketArtifacts = []byte("artifacts")
	// bucketByEnv indexes states by env: key env+"\x00"+state, empty value.
	bucketByEnv = []byte("states_by_env")
	keySchema   = []byte("schema")
	dataBuckets = [][]byte{bucketEnvs, bucketStates, bucketArtifacts, bucketByEnv}
)

// Options tune Open.
type Options struct {
	// Logger receives Recover's findings; nil discards them.
	Logger *slog.Logger
	// Exists reports whether a ready artifact is still present on disk;
	// Recover treats an artifact it returns false for as missing. Nil
	// means every artifact exists.
	Exists func(a Artifact) bool
	// LockTimeout bounds the wait for the file lock; zero means
	// DefaultLockTimeout.
	LockTimeout time.Duration
}

// Manifest is an open manifest database.
type Manifest struct {
	db     *bolt.DB
	log    *slog.Logger
	exists func(Artifact) bool
}

// Open opens the manifest at path, creating and initialising it if it does
// not exist or is empty. It fails with ErrSchema on a database of another
// schema and with ErrLocked if another opener holds it.
func Open(path string, opts Options) (*Manifest, error) {
	timeout := opts.LockTimeout
	if timeout <= 0 {
		timeout = DefaultLockTimeout
	}
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: timeout})
	if errors.Is(err, berrors.ErrTimeout) {
		return nil, fmt.Errorf("open manifest %s: %w (waited %s)", path, ErrLocked, timeout)
	}
	if err != nil {
		return nil, fmt.Errorf("open manifest %s: %w", path, err)
	}
	if err := db.Update(initSchema); err != nil {
		db.Close()
		return nil, fmt.Errorf("open manifest %s: %w", path, err)
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Manifest{db: db, log: log, exists: opts.Exists}, nil
}

// initSchema writes the schema record and buckets into an empty database
// and checks the schema of a non-empty one.
func initSchema(tx *bolt.Tx) error {
	meta := tx.Bucket(bucketMeta)
	if meta == nil {
		empty := true
		_ = tx.ForEach(func([]byte, *bolt.Bucket) error { empty = false; return nil })
		if !empty {
			return fmt.Errorf("check schema: no schema record in a non-empty database: %w", ErrSchema)
		}
		meta, err := tx.CreateBucket(bucketMeta)
		if err != nil {
			return fmt.Errorf("create bucket meta: %w", err)
		}
		v, _ := json.Marshal(SchemaVersion)
		if err := meta.Put(keySchema, v); err != nil {
			return fmt.Errorf("write schema: %w", err)
		}
	} else {
		var v int
		raw := meta.Get(keySchema)
		if err := json.Unmarshal(raw, &v); err != nil {
			return fmt.Errorf("check schema %q: %w", raw, ErrSchema)
		}
		if v != SchemaVersion {
			return fmt.Errorf("check schema: found %d, know %d: %w", v, SchemaVersion, ErrSchema)
		}
	}
	for _, name := range dataBuckets {
		if _, err := tx.CreateBucketIfNotExists(name); err != nil {
			return fmt.Errorf("create bucket %s: %w", name, err)
		}
	}
	return nil
}

// Close closes the database, waiting for transactions in flight.
func (m *Manifest) Close() error {
	if err := m.db.Close(); err != nil {
		return fmt.Errorf("close manifest: %w", err)
	}
	return nil
}

// Path is the database file's path.
func (m *Manifest) Path() string { return m.db.Path() }

// get reads and decodes the record id from bucket name, wrapping
// ErrNotFound when it is absent.
func get[T record](tx *bolt.Tx, name []byte, what, id string) (T, error) {
	var zero T
	v := tx.Bucket(name).Get([]byte(id))
	if v == nil {
		return zero, fmt.Errorf("%s %s: %w", what, id, ErrNotFound)
	}
	return decode[T]([]byte(id), v)
}

func put[T record](tx *bolt.Tx, name []byte, v T) error {
	b, err := encode(v)
	if err != nil {
		return err
	}
	if err := tx.Bucket(name).Put([]byte(v.recordID()), b); err != nil {
		return fmt.Errorf("write %s %s: %w", name, v.recordID(), err)
	}
	return nil
}

// getOne reads record id of a bucket in a transaction of its own; what
// names the record in errors.
func getOne[T record](m *Manifest, name []byte, what, id string) (T, error) {
	var v T
	err := m.db.View(func(tx *bolt.Tx) (err error) {
		v, err = get[T](tx, name, what, id)
		return err
	})
	if err != nil {
		var zero T
		return zero, fmt.Errorf("get %s %s: %w", what, id, err)
	}
	return v, nil
}

// listAll reads every record of a bucket, in key order, in a transaction
// of its own; what names the records in errors.
func listAll[T record](m *Manifest, name []byte, what string) ([]T, error) {
	var vs []T
	err := m.db.View(func(tx *bolt.Tx) (err error) {
		vs, err = all[T](tx, name)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("list %s: %w", what, err)
	}
	return vs, nil
}

// all decodes every record of a bucket in key order.
func all[T record](tx *bolt.Tx, name []byte) ([]T, error) {
	var out []T
	err := tx.Bucket(name).ForEach(func(k, v []byte) error {
		r, err := decode[T](k, v)
		if err != nil {
			return err
		}
		out = append(out, r)
		return nil
	})
	return out, err
}

func byEnvKey(env, state string) []byte {
	return []byte(env + "\x00" + state)
}

// envStateIDs lists the ids of env's states from the index.
func envStateIDs(tx *bolt.Tx, env string) []string {
	prefix := []byte(env + "\x00")
	var ids []string
	c := tx.Bucket(bucketByEnv).Cursor()
	for k, _ := c.Seek(prefix); k != nil && bytes.HasPrefix(k, prefix); k, _ = c.Next() {
		ids = append(ids, string(k[len(prefix):]))
	}
	return ids
}

// deleteState removes a state record and its index entry.
func deleteState(tx *bolt.Tx, s State) error {
	if err := tx.Bucket(bucketStates).Delete([]byte(s.ID)); err != nil {
		return fmt.Errorf("delete state %s: %w", s.ID, err)
	}
	if err := tx.Bucket(bucketByEnv).Delete(byEnvKey(s.Env, s.ID)); err != nil {
		return fmt.Errorf("delete state %s: %w", s.ID, err)
	}
	return nil
}
