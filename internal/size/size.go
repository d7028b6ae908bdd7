// Package size reads the sizes of a VM's memory and disk: create's --memory
// and --disk, and memory in a repository's .agent-vm/config.toml. One
// grammar for both, so a size that works on the command line works in the
// file:
//
//	size = number [unit]
//	number: a positive decimal, a fraction allowed (4, 1.5, 0.5)
//	unit:   K, M, G or T, in either case, optionally followed by B or iB
//	        (4G, 4g, 4GB, 4GiB are the same); every unit is binary: 1G is 1024M
//
// A number without a unit is in the caller's unit (memory: M, disk: G).
// The size must come to a whole number of MiB, from 1M to 1024T. Human
// writes a size for people. A new VM's defaults, and Check of its CPUs,
// memory and disk against their ranges and the host's (ReadHost), are
// here too.
package size

import (
	"errors"
	"math"
	"strconv"
	"strings"
)

// The reasons ParseMiB refuses a size, for callers to name the flag or key
// around: `--memory "lots" is not a size`.
var (
	ErrSyntax = errors.New("not a size")
	ErrRange  = errors.New("out of range")
	ErrWhole  = errors.New("not a whole number of MiB")
)

// maxMiB is the largest size: 1 PiB, far above any VM's.
const maxMiB = 1 << 30

var mibPer = map[string]float64{"K": 1.0 / 1024, "M": 1, "G": 1024, "T": 1024 * 1024}

// ParseMiB reads s as a size in MiB; a bare number is in unit ("M" or "G").
// Its errors are ErrSyntax, ErrRange or ErrWhole.
func ParseMiB(s, unit string) (int, error) {
	t := strings.ToUpper(strings.TrimSpace(s))
	t = strings.TrimSuffix(strings.TrimSuffix(t, "B"), "I")
	if n := len(t); n > 0 && strings.ContainsRune("KMGT", rune(t[n-1])) {
		unit, t = t[n-1:], t[:n-1]
	}
	v, err := strconv.ParseFloat(strings.TrimSpace(t), 64)
	if err != nil || v <= 0 || math.IsInf(v, 0) || math.IsNaN(v) {
		return 0, ErrSyntax
	}
	mib := v * mibPer[unit]
	if mib < 1 || mib > maxMiB {
		return 0, ErrRange
	}
	if mib != math.Trunc(mib) {
		return 0, ErrWhole
	}
	return int(mib), nil
}
