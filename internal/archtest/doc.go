// Package archtest keeps docs/ARCHITECTURE.md true: its test reads the
// page's package table and fails when an internal package imports an
// agent-vm package its row does not allow, when the table names a
// package that does not exist, or when an internal package has no row.
// It has no code of its own.
package archtest
