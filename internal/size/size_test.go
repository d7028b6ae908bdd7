package size

import (
	"errors"
	"testing"
)

func TestParseMiB(t *testing.T) {
	for _, tc := range []struct {
		in, unit string
		want     int
	}{
		// What --memory and --disk took before this package.
		{"4G", "M", 4096}, {"4096M", "M", 4096}, {"512MiB", "M", 512}, {"20GB", "G", 20480},
		{"1.5G", "M", 1536}, {"4GiB", "M", 4096}, {"5T", "M", 5 << 20}, {"2048K", "M", 2},
		{"4 G", "M", 4096}, {" 4g ", "M", 4096}, {"1e3M", "M", 1000},
		// A bare number is in the caller's unit.
		{"4096", "M", 4096}, {"20", "G", 20480},
		// What config.toml's memory took before: ^[0-9]{1,7}[MG]$, either case.
		{"3G", "M", 3072}, {"512M", "M", 512}, {"512m", "M", 512}, {"0004G", "M", 4096},
		{"9999999M", "M", 9999999}, {"1048576G", "M", 1 << 30},
	} {
		if got, err := ParseMiB(tc.in, tc.unit); err != nil || got != tc.want {
			t.Errorf("ParseMiB(%q, %q) = %d, %v; want %d", tc.in, tc.unit, got, err, tc.want)
		}
	}
}

func TestParseMiBRefuses(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want error
	}{
		{"lots", ErrSyntax}, {"", ErrSyntax}, {"G", ErrSyntax}, {"-4G", ErrSyntax}, {"0M", ErrSyntax},
		{"4X", ErrSyntax}, {"4GG", ErrSyntax}, {"Inf", ErrSyntax},
		{"512K", ErrRange}, {"1025T", ErrRange}, {"9999999G", ErrRange},
		{"1.0001G", ErrWhole}, {"1.5M", ErrWhole},
	} {
		if got, err := ParseMiB(tc.in, "M"); !errors.Is(err, tc.want) {
			t.Errorf("ParseMiB(%q) = %d, %v; want %v", tc.in, got, err, tc.want)
		}
	}
}
