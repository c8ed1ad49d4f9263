package forward

import (
	"io"
	"net"
	"testing"
	"time"
)

// tcpPair returns both ends of a loopback TCP connection.
func tcpPair(t *testing.T) (client, server net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, _ := ln.Accept()
		accepted <- c
	}()
	client, err = net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	select {
	case server = <-accepted:
	case <-time.After(5 * time.Second):
		t.Fatal("accept timed out")
	}
	t.Cleanup(func() { client.Close(); server.Close() })
	return client, server
}

// TestJoinHalfClose: a client that sends its request and shuts down its
// writing side still reads the whole answer, which the server sends only
// after seeing EOF; the byte counts are each direction's.
func TestJoinHalfClose(t *testing.T) {
	client, a := tcpPair(t)
	b, server := tcpPair(t)
	type counts struct{ ab, ba int64 }
	done := make(chan counts, 1)
	go func() {
		ab, ba := Join(a, b)
		done <- counts{ab, ba}
	}()
	deadline := time.Now().Add(10 * time.Second)
	client.SetDeadline(deadline)
	server.SetDeadline(deadline)

	if _, err := client.Write([]byte("request")); err != nil {
		t.Fatal(err)
	}
	client.(*net.TCPConn).CloseWrite()
	got, err := io.ReadAll(server)
	if err != nil || string(got) != "request" {
		t.Fatalf("server read %q, %v; want %q and EOF", got, err, "request")
	}
	if _, err := server.Write([]byte("the answer")); err != nil {
		t.Fatal(err)
	}
	server.Close()
	got, err = io.ReadAll(client)
	if err != nil || string(got) != "the answer" {
		t.Fatalf("client read %q, %v; want %q and EOF", got, err, "the answer")
	}
	select {
	case c := <-done:
		if want := (counts{7, 10}); c != want {
			t.Errorf("Join counted %+v, want %+v", c, want)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Join did not return after both sides finished")
	}
}

// TestJoinResetEndsBoth: when one side is reset, the other is closed too
// rather than left waiting for data that will never come.
func TestJoinResetEndsBoth(t *testing.T) {
	client, a := tcpPair(t)
	b, server := tcpPair(t)
	done := make(chan struct{})
	go func() { Join(a, b); close(done) }()
	server.(*net.TCPConn).SetLinger(0)
	server.Close() // an RST towards b
	client.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.ReadAll(client); err != nil {
		t.Fatalf("client: %v; want its connection closed", err)
	}
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Join did not return after a reset")
	}
}
