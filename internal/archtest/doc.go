// Package archtest keeps docs/architecture.md's layer table true: its test
// reads the table and checks every import of the module against it. It has
// no code of its own.
package archtest
