package ports

import (
	"errors"
	"net"
	"testing"
)

func TestPickSkipsTakenAndListening(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	busy := ln.Addr().(*net.TCPAddr).Port
	r := Range{Lo: busy, Hi: busy + 20}
	taken := map[int]string{busy + 1: "vm a"}
	got, err := Pick(r, taken, Listenable)
	if err != nil {
		t.Fatal(err)
	}
	if got == busy || got == busy+1 {
		t.Errorf("picked %d, which is listening or taken", got)
	}
	if !Listenable(got) {
		t.Errorf("picked %d, which cannot be bound", got)
	}
}

func TestPickExhausted(t *testing.T) {
	_, err := Pick(Range{Lo: 5000, Hi: 5001}, map[int]string{5000: "a", 5001: "b"}, Listenable)
	if err == nil {
		t.Fatal("want an error when the range is exhausted")
	}
}

func TestCheck(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	busy := ln.Addr().(*net.TCPAddr).Port
	if err := Check(busy, nil, Listenable); !errors.Is(err, ErrTaken) {
		t.Errorf("listening port: got %v, want ErrTaken", err)
	}
	if err := Check(busy+1, map[int]string{busy + 1: `VM "x"`}, Listenable); !errors.Is(err, ErrTaken) {
		t.Errorf("recorded port: got %v, want ErrTaken", err)
	}
	if err := Check(80, nil, Listenable); err == nil {
		t.Error("privileged port accepted")
	}
}
