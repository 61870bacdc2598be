//! What state takes in memory, as the allocator sees it: each heap allocation rounded up to
//! 16 bytes plus the allocator's 16-byte header, and a hash table's buckets (a power of two
//! at least 8/7 of its capacity), each holding an entry and a control byte. Budgets
//! (`--state-memory`) compare these estimates with the memory the process may use, so they
//! count what is allocated, not only the bytes of the values.

/// The bytes an allocation of `n` bytes takes (none when `n` is 0).
pub fn allocation(n: usize) -> usize {
    if n == 0 {
        0
    } else {
        n.next_multiple_of(16) + 16
    }
}

/// The bytes of the table of a hash map or set of entries `T` with room for `capacity`.
pub fn hash_table<T>(capacity: usize) -> usize {
    if capacity == 0 {
        return 0;
    }
    let buckets = (capacity * 8 / 7).next_power_of_two().max(4);
    allocation(buckets * (std::mem::size_of::<T>() + 1) + 16)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hash_table_takes_at_least_its_entries() {
        assert_eq!(allocation(0), 0);
        assert_eq!(allocation(1), 32);
        assert_eq!(allocation(16), 32);
        assert_eq!(hash_table::<u64>(0), 0);
        for capacity in [1, 3, 7, 14, 28, 1000, 1 << 20] {
            let bytes = hash_table::<(u64, u64)>(capacity);
            assert!(bytes >= capacity * 17 && bytes <= 4 * capacity * 17 + 128, "{capacity}: {bytes}");
        }
        // The same capacity the map reports after growing.
        let mut map = hashbrown::HashMap::new();
        (0..1000u64).for_each(|i| {
            map.insert(i, i);
        });
        assert_eq!(map.capacity(), 1792);
        assert_eq!(hash_table::<(u64, u64)>(map.capacity()), allocation(2048 * 17 + 16));
    }
}
