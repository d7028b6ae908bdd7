package size

import "fmt"

// Human is a size in MiB for people: "5 TiB", "24 GiB", "1536 MiB".
func Human(mib int) string {
	switch {
	case mib >= 1<<20 && mib%(1<<20) == 0:
		return fmt.Sprintf("%d TiB", mib>>20)
	case mib >= 1<<10 && mib%(1<<10) == 0:
		return fmt.Sprintf("%d GiB", mib>>10)
	case mib >= 10<<10:
		return fmt.Sprintf("%.1f GiB", float64(mib)/1024)
	}
	return fmt.Sprintf("%d MiB", mib)
}
