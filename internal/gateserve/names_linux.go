package gateserve

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"syscall"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// The names range reaches the service through two pieces of the kernel's
// network stack, both set up as root before the jail, in the service's
// network namespace:
//
//   - a local route for the range (`ip route add local RANGE dev lo`):
//     every address of it is the host's own, so the kernel delivers
//     connections to it locally and answers ARP for it on any interface
//     (the clients on an internal subnet that holds the range find the
//     service without a route of their own);
//   - an nftables table with one rule in prerouting: TCP to the range,
//     any port, is handed to one listener (tproxy), whose accepted
//     connections carry the address and port the client dialed.
//
// Rejected: eBPF sk_lookup does the same with one program, but needs
// CAP_BPF or CAP_SYS_ADMIN (Docker 20.10's default seccomp profile allows
// bpf() only with CAP_SYS_ADMIN); REDIRECT and SO_ORIGINAL_DST need
// conntrack's nat; a listener per port covers only ports named in
// advance. tproxy needs CAP_NET_ADMIN at set-up and nothing after: the
// listener's IP_TRANSPARENT is set before the jail and its accepted
// sockets inherit it.
//
// The table is created owned by the netlink socket that made it
// (NFT_TABLE_F_OWNER, Linux 5.12): it goes when the service's process
// does, however it ends. On older kernels it is an ordinary table, which
// the unjailed parent removes when the service stops (removeInterception).
//
// A range is claimed first with an abstract unix socket named after it:
// abstract names belong to the network namespace and are released when
// their process dies, so the claim says whether a live service has the
// range. A second service given the same range stops at start instead of
// taking the first one's table, and a parent cleaning up after its child
// leaves alone a route that another service holds.

// interception is the names range's claim, route and nftables table.
type interception struct {
	prefix netip.Prefix
	table  string
	claim  int // the range's abstract socket; -1 once released
	fd     int // the nftables socket that owns the table; -1 once closed
	owned  bool
}

// errRangeTaken: another live process in this network namespace holds
// the range.
var errRangeTaken = errors.New("another gate service in this network namespace serves this names range")

// claimRange binds the range's abstract unix socket.
func claimRange(p netip.Prefix) (int, error) {
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("claiming names %s: %w", p, err)
	}
	if err := unix.Bind(fd, &unix.SockaddrUnix{Name: "@moat-gate-names/" + p.String()}); err != nil {
		unix.Close(fd)
		if errors.Is(err, unix.EADDRINUSE) {
			return -1, fmt.Errorf("names %s: %w; give each service its own range", p, errRangeTaken)
		}
		return -1, fmt.Errorf("claiming names %s: %w", p, err)
	}
	return fd, nil
}

// tableName is the nftables table for a range: one per range, so two
// services cannot claim the same range in one network namespace (the
// second cannot delete a table the first owns).
func tableName(p netip.Prefix) string {
	return "moat_gate_" + strings.NewReplacer(".", "_", "/", "_").Replace(p.String())
}

// intercept routes prefix to the host and hands every TCP connection to it
// to the transparent listener at to. A table left by a service that
// stopped without removing it is replaced.
func intercept(prefix netip.Prefix, to netip.AddrPort) (*interception, error) {
	claim, err := claimRange(prefix)
	if err != nil {
		return nil, err
	}
	if err := addLocalRoute(prefix); err != nil {
		unix.Close(claim)
		return nil, err
	}
	fd, err := nftSocket()
	if err != nil {
		delLocalRoute(prefix)
		unix.Close(claim)
		return nil, err
	}
	ic := &interception{prefix: prefix, table: tableName(prefix), claim: claim, fd: fd}
	fail := func(err error) (*interception, error) {
		ic.Close()
		return nil, err
	}
	switch err := nftBatch(fd, delTableMsg(ic.table)); {
	case err == nil, errors.Is(err, unix.ENOENT):
	case errors.Is(err, unix.EPERM), errors.Is(err, unix.EBUSY):
		return fail(fmt.Errorf("the nftables table %s for names %s belongs to another running gate service: give each service its own range (%w)", ic.table, prefix, err))
	default:
		return fail(fmt.Errorf("removing a stale nftables table %s: %w", ic.table, err))
	}
	ic.owned = true
	err = nftBatch(fd, tproxyRules(ic.table, nftTableOwner, prefix, to)...)
	if errors.Is(err, unix.EOPNOTSUPP) || errors.Is(err, unix.EINVAL) {
		// Before Linux 5.12 a table cannot be owned by its socket.
		ic.owned = false
		err = nftBatch(fd, tproxyRules(ic.table, 0, prefix, to)...)
	}
	if err != nil {
		return fail(fmt.Errorf("adding the nftables rule that hands TCP to %s to the service (does the kernel have nft_tproxy?): %w", prefix, err))
	}
	return ic, nil
}

// Close removes the table (closing its owner does) and the route. Jailed,
// without CAP_NET_ADMIN, only the first works; the parent removes the
// rest (removeInterception).
func (ic *interception) Close() error {
	if ic == nil || ic.fd < 0 {
		return nil
	}
	if !ic.owned {
		nftBatch(ic.fd, delTableMsg(ic.table))
	}
	unix.Close(ic.fd)
	ic.fd = -1
	delLocalRoute(ic.prefix)
	unix.Close(ic.claim)
	ic.claim = -1
	return nil
}

// removeInterception removes what intercept set up for prefix, for the
// unjailed parent once the service stopped: whatever is already gone is
// no error, and a range another live service holds is left alone.
func removeInterception(prefix netip.Prefix) error {
	claim, err := claimRange(prefix)
	if errors.Is(err, errRangeTaken) {
		return nil
	}
	if err != nil {
		return err
	}
	defer unix.Close(claim)
	var errs []error
	if fd, err := nftSocket(); err == nil {
		if err := nftBatch(fd, delTableMsg(tableName(prefix))); err != nil && !errors.Is(err, unix.ENOENT) {
			errs = append(errs, fmt.Errorf("removing the nftables table for %s: %w", prefix, err))
		}
		unix.Close(fd)
	}
	if err := delLocalRoute(prefix); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

func localRoute(prefix netip.Prefix) (*netlink.Route, error) {
	lo, err := netlink.LinkByName("lo")
	if err != nil {
		return nil, fmt.Errorf("finding the loopback interface: %w", err)
	}
	return &netlink.Route{
		LinkIndex: lo.Attrs().Index,
		Dst:       &net.IPNet{IP: prefix.Addr().AsSlice(), Mask: net.CIDRMask(prefix.Bits(), 32)},
		Type:      unix.RTN_LOCAL,
		Table:     unix.RT_TABLE_LOCAL,
		Scope:     netlink.SCOPE_HOST,
	}, nil
}

func addLocalRoute(prefix netip.Prefix) error {
	r, err := localRoute(prefix)
	if err != nil {
		return err
	}
	if err := netlink.RouteReplace(r); err != nil {
		return fmt.Errorf("adding the local route for names %s (ip route add local %s dev lo): %w", prefix, prefix, err)
	}
	return nil
}

func delLocalRoute(prefix netip.Prefix) error {
	r, err := localRoute(prefix)
	if err != nil {
		return err
	}
	if err := netlink.RouteDel(r); err != nil && !errors.Is(err, unix.ESRCH) {
		return fmt.Errorf("removing the local route for names %s: %w", prefix, err)
	}
	return nil
}

// transparentListener listens on ap with IP_TRANSPARENT, which tproxy
// requires of the socket it hands connections to; set now, as root.
func transparentListener(ap netip.AddrPort) (net.Listener, error) {
	lc := net.ListenConfig{Control: func(_, _ string, rc syscall.RawConn) error {
		var serr error
		err := rc.Control(func(fd uintptr) {
			serr = unix.SetsockoptInt(int(fd), unix.SOL_IP, unix.IP_TRANSPARENT, 1)
		})
		return errors.Join(err, serr)
	}}
	l, err := lc.Listen(nil, "tcp4", ap.String())
	if err != nil {
		return nil, fmt.Errorf("listening for the names range on %s with IP_TRANSPARENT: %w", ap, err)
	}
	return l, nil
}

// nftables over netlink: the few messages and attributes the rule needs,
// from linux/netfilter/nf_tables.h and nfnetlink.h. Every integer
// attribute is big-endian.
const (
	nfnlSubsysNFTables = 10
	nfnlMsgBatchBegin  = 0x10
	nfnlMsgBatchEnd    = 0x11

	nftMsgNewTable = 0
	nftMsgDelTable = 2
	nftMsgNewChain = 3
	nftMsgNewRule  = 6

	nfprotoIPv4 = 2

	nftaTableName  = 1
	nftaTableFlags = 2
	nftTableOwner  = 2 // NFT_TABLE_F_OWNER

	nftaChainTable   = 1
	nftaChainName    = 3
	nftaChainHook    = 4
	nftaChainPolicy  = 5
	nftaChainType    = 7
	nftaHookHooknum  = 1
	nftaHookPrio     = 2
	nfInetPreRouting = 0
	nfIPPriMangle    = -150
	nfAccept         = 1

	nftaRuleTable = 1
	nftaRuleChain = 2
	nftaRuleExprs = 4
	nftaListElem  = 1
	nftaExprName  = 1
	nftaExprData  = 2
	nftaDataValue = 1

	nftReg1 = 1 // NFT_REG_1: 16 bytes
	nftReg2 = 2

	nftaMetaDreg    = 1
	nftaMetaKey     = 2
	nftMetaL4Proto  = 16
	nftaCmpSreg     = 1
	nftaCmpOp       = 2
	nftaCmpData     = 3
	nftCmpEq        = 0
	nftaPayloadDreg = 1
	nftaPayloadBase = 2
	nftaPayloadOff  = 3
	nftaPayloadLen  = 4
	nftPayloadNet   = 1
	nftaBitwiseSreg = 1
	nftaBitwiseDreg = 2
	nftaBitwiseLen  = 3
	nftaBitwiseMask = 4
	nftaBitwiseXor  = 5
	nftaImmDreg     = 1
	nftaImmData     = 2
	nftaTproxyFam   = 1
	nftaTproxyAddr  = 2
	nftaTproxyPort  = 3

	nlaFNested = 1 << 15
)

// nftChain is the one chain of the table.
const nftChain = "prerouting"

// tproxyRules is the batch that creates, in an ip table, the equivalent of
//
//	table ip NAME {
//		chain prerouting {
//			type filter hook prerouting priority mangle; policy accept;
//			meta l4proto tcp ip daddr PREFIX tproxy to TO
//		}
//	}
func tproxyRules(table string, flags uint32, prefix netip.Prefix, to netip.AddrPort) [][]byte {
	net4 := prefix.Masked().Addr().As4()
	mask := net.CIDRMask(prefix.Bits(), 32)
	toAddr := to.Addr().As4()
	port := binary.BigEndian.AppendUint16(nil, to.Port())
	exprs := [][]byte{
		expr("meta", nla(nftaMetaKey, be32(nftMetaL4Proto)), nla(nftaMetaDreg, be32(nftReg1))),
		expr("cmp", nla(nftaCmpSreg, be32(nftReg1)), nla(nftaCmpOp, be32(nftCmpEq)), nested(nftaCmpData, nla(nftaDataValue, []byte{unix.IPPROTO_TCP}))),
		expr("payload", nla(nftaPayloadDreg, be32(nftReg1)), nla(nftaPayloadBase, be32(nftPayloadNet)),
			nla(nftaPayloadOff, be32(16)), nla(nftaPayloadLen, be32(4))), // the IPv4 destination
		expr("bitwise", nla(nftaBitwiseSreg, be32(nftReg1)), nla(nftaBitwiseDreg, be32(nftReg1)), nla(nftaBitwiseLen, be32(4)),
			nested(nftaBitwiseMask, nla(nftaDataValue, mask)), nested(nftaBitwiseXor, nla(nftaDataValue, make([]byte, 4)))),
		expr("cmp", nla(nftaCmpSreg, be32(nftReg1)), nla(nftaCmpOp, be32(nftCmpEq)), nested(nftaCmpData, nla(nftaDataValue, net4[:]))),
		expr("immediate", nla(nftaImmDreg, be32(nftReg1)), nested(nftaImmData, nla(nftaDataValue, toAddr[:]))),
		expr("immediate", nla(nftaImmDreg, be32(nftReg2)), nested(nftaImmData, nla(nftaDataValue, port))),
		expr("tproxy", nla(nftaTproxyFam, be32(nfprotoIPv4)), nla(nftaTproxyAddr, be32(nftReg1)), nla(nftaTproxyPort, be32(nftReg2))),
	}
	create := uint16(unix.NLM_F_REQUEST | unix.NLM_F_ACK | unix.NLM_F_CREATE | unix.NLM_F_EXCL)
	return [][]byte{
		nfMsg(nftMsgNewTable, create, nla(nftaTableName, cstr(table)), nla(nftaTableFlags, be32(flags))),
		nfMsg(nftMsgNewChain, create, nla(nftaChainTable, cstr(table)), nla(nftaChainName, cstr(nftChain)),
			nested(nftaChainHook, nla(nftaHookHooknum, be32(nfInetPreRouting)), nla(nftaHookPrio, be32(nfPrio(nfIPPriMangle)))),
			nla(nftaChainPolicy, be32(nfAccept)), nla(nftaChainType, cstr("filter"))),
		nfMsg(nftMsgNewRule, create|unix.NLM_F_APPEND, nla(nftaRuleTable, cstr(table)), nla(nftaRuleChain, cstr(nftChain)),
			nested(nftaRuleExprs, exprs...)),
	}
}

func delTableMsg(table string) []byte {
	return nfMsg(nftMsgDelTable, unix.NLM_F_REQUEST|unix.NLM_F_ACK, nla(nftaTableName, cstr(table)))
}

func expr(name string, data ...[]byte) []byte {
	return nested(nftaListElem, nla(nftaExprName, cstr(name)), nested(nftaExprData, data...))
}

// nfMsg is an nftables message: its netlink header (length and sequence
// filled in by nftBatch) and nfgenmsg, then attrs.
func nfMsg(typ, flags uint16, attrs ...[]byte) []byte {
	b := make([]byte, unix.NLMSG_HDRLEN, 64)
	binary.NativeEndian.PutUint16(b[4:], nfnlSubsysNFTables<<8|typ)
	binary.NativeEndian.PutUint16(b[6:], flags)
	b = append(b, nfprotoIPv4, 0, 0, 0) // nfgenmsg: family, version 0, res_id 0
	for _, a := range attrs {
		b = append(b, a...)
	}
	return b
}

func nla(typ uint16, data []byte) []byte {
	n := unix.SizeofNlAttr + len(data)
	b := make([]byte, 4, nlaAlign(n))
	binary.NativeEndian.PutUint16(b[0:], uint16(n))
	binary.NativeEndian.PutUint16(b[2:], typ)
	b = append(b, data...)
	return append(b, make([]byte, nlaAlign(n)-n)...)
}

func nested(typ uint16, children ...[]byte) []byte {
	var data []byte
	for _, c := range children {
		data = append(data, c...)
	}
	return nla(typ|nlaFNested, data)
}

// nfPrio is a hook priority as the kernel reads it: a signed 32-bit
// number in a be32 attribute.
func nfPrio(p int32) uint32 { return uint32(p) }

func nlaAlign(n int) int   { return (n + unix.NLA_ALIGNTO - 1) &^ (unix.NLA_ALIGNTO - 1) }
func be32(v uint32) []byte { return binary.BigEndian.AppendUint32(nil, v) }
func cstr(s string) []byte { return append([]byte(s), 0) }

func nftSocket() (int, error) {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_NETFILTER)
	if err != nil {
		return -1, fmt.Errorf("opening a netfilter netlink socket: %w", err)
	}
	if err := unix.Bind(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("binding a netfilter netlink socket: %w", err)
	}
	// A kernel that does not answer within this is wedged; the service
	// should say so rather than hang at start.
	tv := unix.NsecToTimeval((5 * time.Second).Nanoseconds())
	unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv)
	return fd, nil
}

// nftBatch sends msgs as one nftables transaction (all or nothing) and
// waits for the kernel's acknowledgement of each: the first error is
// returned as its errno.
func nftBatch(fd int, msgs ...[]byte) error {
	seq := uint32(time.Now().UnixNano())
	var buf []byte
	put := func(m []byte) {
		binary.NativeEndian.PutUint32(m[0:], uint32(len(m)))
		binary.NativeEndian.PutUint32(m[8:], seq)
		seq++
		buf = append(buf, m...)
	}
	batch := func(typ uint16) []byte {
		b := make([]byte, unix.NLMSG_HDRLEN, unix.NLMSG_HDRLEN+4)
		binary.NativeEndian.PutUint16(b[4:], typ)
		binary.NativeEndian.PutUint16(b[6:], unix.NLM_F_REQUEST)
		return binary.BigEndian.AppendUint16(append(b, unix.AF_UNSPEC, 0), nfnlSubsysNFTables)
	}
	put(batch(nfnlMsgBatchBegin))
	first := seq
	for _, m := range msgs {
		put(m)
	}
	put(batch(nfnlMsgBatchEnd))
	if err := unix.Sendto(fd, buf, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return fmt.Errorf("sending to nftables: %w", err)
	}
	want := len(msgs)
	rb := make([]byte, 1<<16)
	for want > 0 {
		n, _, err := unix.Recvfrom(fd, rb, 0)
		if err != nil {
			return fmt.Errorf("reading nftables' answer: %w", err)
		}
		msgsIn, err := syscall.ParseNetlinkMessage(rb[:n])
		if err != nil {
			return fmt.Errorf("parsing nftables' answer: %w", err)
		}
		for _, m := range msgsIn {
			if m.Header.Type != unix.NLMSG_ERROR || m.Header.Seq < first || m.Header.Seq >= first+uint32(len(msgs)) {
				continue
			}
			if len(m.Data) < 4 {
				return errors.New("a short nftables answer")
			}
			if code := int32(binary.NativeEndian.Uint32(m.Data)); code != 0 {
				return unix.Errno(-code)
			}
			want--
		}
	}
	return nil
}
