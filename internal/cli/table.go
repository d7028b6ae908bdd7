package cli

import (
	"io"
	"strings"

	"github.com/agent-vm/agent-vm/internal/termsafe"
)

// writeTable prints rows as columns two spaces apart, each as wide as its
// widest cell in terminal columns (text/tabwriter counts runes, which
// misaligns wide characters). The last cell of a row is not padded.
func writeTable(w io.Writer, rows [][]string) error {
	var widths []int
	for _, row := range rows {
		for i, cell := range row[:len(row)-1] {
			if i == len(widths) {
				widths = append(widths, 0)
			}
			widths[i] = max(widths[i], termsafe.Width(cell))
		}
	}
	var b strings.Builder
	for _, row := range rows {
		var line strings.Builder
		for i, cell := range row {
			line.WriteString(cell)
			if i < len(row)-1 {
				line.WriteString(strings.Repeat(" ", widths[i]-termsafe.Width(cell)+2))
			}
		}
		b.WriteString(strings.TrimRight(line.String(), " "))
		b.WriteByte('\n')
	}
	_, err := io.WriteString(w, b.String())
	return err
}
