package cli

import (
	"math"
	"strconv"
	"strings"
)

// parseSize reads sizes such as 4G, 4096M, 512MiB, 20GB, 1.5G into MiB.
// A bare number is in defaultUnit ("M" or "G").
func parseSize(flag, s, defaultUnit string) (int, error) {
	in := strings.TrimSpace(s)
	t := strings.ToUpper(in)
	t = strings.TrimSuffix(strings.TrimSuffix(t, "B"), "I")
	unit := defaultUnit
	if n := len(t); n > 0 && strings.ContainsRune("KMGT", rune(t[n-1])) {
		unit, t = t[n-1:], t[:n-1]
	}
	v, err := strconv.ParseFloat(strings.TrimSpace(t), 64)
	if err != nil || v <= 0 {
		return 0, usagef("--%s %q: not a size (hint: e.g. --%s 4G or 4096M)", flag, s, flag)
	}
	mib := v * map[string]float64{"K": 1.0 / 1024, "M": 1, "G": 1024, "T": 1024 * 1024}[unit]
	if mib < 1 || mib > 1<<30 {
		return 0, usagef("--%s %q is out of range", flag, s)
	}
	if mib != math.Trunc(mib) {
		return 0, usagef("--%s %q is not a whole number of MiB (hint: e.g. --%s 4G or 4096M)", flag, s, flag)
	}
	return int(mib), nil
}
