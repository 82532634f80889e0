//! zig-checksum: a Sweep handler in Zig (0.14), the same contract as the Rust `checksum`
//! module so the two can be checked against each other.
//!
//! Payload `{"data": "...", "algorithm": "sha256"}` (`algorithm` optional, default `sha256`;
//! one of `sha224`, `sha256`, `sha384`, `sha512`, case, surrounding whitespace and dashes
//! ignored, so `SHA-256` works) -> `{"algorithm": "sha256", "hex": "..."}` with the canonical
//! name and the lowercase hex digest of the UTF-8 bytes of `data`.
//!
//! The guest contract (README, "Writing a handler"): payload on stdin, result on stdout, logs
//! on stderr, the exit code decides the outcome. A payload that is not a JSON object of that
//! shape (unknown or duplicate fields included) or names an unknown algorithm is a permanent
//! failure: exit 100 with a one-line reason as the last line of stderr. Failing to read stdin
//! or write stdout exits 1, which the runner retries.
//!
//! Build (see docs/guests.md):
//!   python3 -m ziglang build-exe -target wasm32-wasi -O ReleaseSmall --stack 1048576 checksum.zig
//! or natively: `echo '{"data":"abc"}' | python3 -m ziglang run checksum.zig`.

const std = @import("std");
const sha2 = std.crypto.hash.sha2;

const exit_permanent: u8 = 100;
const exit_retry: u8 = 1;
/// Far above any payload the runner's memory limit lets through; only bounds the read.
const max_payload_bytes = 1 << 30;

const Input = struct {
    data: []const u8,
    algorithm: []const u8 = "sha256",
};

const Algorithm = enum {
    sha224,
    sha256,
    sha384,
    sha512,

    /// Trims, lowercases and drops dashes, then matches a canonical name.
    fn parse(buf: []u8, requested: []const u8) ?Algorithm {
        const trimmed = std.mem.trim(u8, requested, " \t\r\n");
        var len: usize = 0;
        for (trimmed) |c| {
            if (c == '-') continue;
            if (len == buf.len) return null;
            buf[len] = std.ascii.toLower(c);
            len += 1;
        }
        return std.meta.stringToEnum(Algorithm, buf[0..len]);
    }

    /// Writes the lowercase hex digest of `data` into `out` and returns it.
    fn hexDigest(self: Algorithm, data: []const u8, out: *[2 * sha2.Sha512.digest_length]u8) []const u8 {
        return switch (self) {
            inline else => |a| blk: {
                const H = switch (a) {
                    .sha224 => sha2.Sha224,
                    .sha256 => sha2.Sha256,
                    .sha384 => sha2.Sha384,
                    .sha512 => sha2.Sha512,
                };
                var digest: [H.digest_length]u8 = undefined;
                H.hash(data, &digest, .{});
                const hex = std.fmt.bytesToHex(digest, .lower);
                @memcpy(out[0..hex.len], &hex);
                break :blk out[0..hex.len];
            },
        };
    }
};

/// Prints the reason as one line on stderr and returns `code` for `main` to exit with.
fn fail(code: u8, comptime fmt: []const u8, args: anytype) u8 {
    std.io.getStdErr().writer().print("zig-checksum: " ++ fmt ++ "\n", args) catch {};
    return code;
}

fn envOr(allocator: std.mem.Allocator, name: []const u8, fallback: []const u8) []const u8 {
    return std.process.getEnvVarOwned(allocator, name) catch fallback;
}

pub fn main() u8 {
    var arena = std.heap.ArenaAllocator.init(std.heap.page_allocator);
    defer arena.deinit();
    const allocator = arena.allocator();

    const payload = std.io.getStdIn().readToEndAlloc(allocator, max_payload_bytes) catch |err|
        return fail(exit_retry, "cannot read the task payload from stdin: {s}", .{@errorName(err)});
    const parsed = std.json.parseFromSliceLeaky(Input, allocator, payload, .{}) catch |err|
        return fail(exit_permanent, "invalid task payload: {s} (expected {{\"data\": \"...\", \"algorithm\": \"sha256\"}})", .{@errorName(err)});

    var name_buf: [16]u8 = undefined;
    const algorithm = Algorithm.parse(&name_buf, parsed.algorithm) orelse
        return fail(exit_permanent, "unknown algorithm {}; supported: sha224, sha256, sha384, sha512", .{std.json.fmt(parsed.algorithm, .{})});

    var hex_buf: [2 * sha2.Sha512.digest_length]u8 = undefined;
    const hex = algorithm.hexDigest(parsed.data, &hex_buf);

    std.io.getStdErr().writer().print("zig-checksum: task {s} attempt {s}/{s}: {s} of {d} bytes\n", .{
        envOr(allocator, "SWEEP_TASK_ID", "-"),
        envOr(allocator, "SWEEP_ATTEMPT", "-"),
        envOr(allocator, "SWEEP_MAX_ATTEMPTS", "-"),
        @tagName(algorithm),
        parsed.data.len,
    }) catch {};
    std.io.getStdOut().writer().print("{{\"algorithm\":\"{s}\",\"hex\":\"{s}\"}}\n", .{ @tagName(algorithm), hex }) catch |err|
        return fail(exit_retry, "cannot write the result to stdout: {s}", .{@errorName(err)});
    return 0;
}
