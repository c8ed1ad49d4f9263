package guest

import (
	"os"
	"path/filepath"
	"testing"
)

func TestSocketInode(t *testing.T) {
	table := `  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   3: 0200580A:0016 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0        4 1 0000000000000000 0 0 0 0 -1
   4: 0200580A:ADD9 1A3F1264:01BB 02 00000000:00000000 00:00000000 00000000  1000        0       17 1 0000000000000000 0 0 0 0 -1
   5: 0200580A:C350 1A3F1264:01BB 07 00000000:00000000 00:00000000 00000000  1000        0        0 1 0000000000000000 0 0 0 0 -1
`
	p := filepath.Join(t.TempDir(), "tcp")
	if err := os.WriteFile(p, []byte(table), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		port uint16
		want string
	}{{0xADD9, "17"}, {22, "4"}, {0xC350, ""}, {9, ""}} {
		got, err := socketInode(p, tt.port)
		if got != tt.want || (tt.want == "") != (err != nil) {
			t.Errorf("port %d: %q, %v; want %q", tt.port, got, err, tt.want)
		}
	}
}
